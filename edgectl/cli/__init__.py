"""The ``edgectl`` command line (typer)."""

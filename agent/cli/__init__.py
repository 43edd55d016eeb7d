"""The ``edge-agent`` command line."""

"""Entry point of ``edge-agent``: one line and a stable exit code on error."""

from __future__ import annotations

import sys
import traceback
from collections.abc import Sequence

import typer

# Command modules register themselves on `app` when imported.
from agent.cli import (
    probe,  # noqa: F401  (edge-agent probe)
    run,  # noqa: F401  (edge-agent run)
)
from agent.cli.app import app
from edgecore.errors import EdgeError

__all__ = ["main"]


def main(argv: Sequence[str] | None = None) -> None:
    """Run edge-agent; exit with the documented code."""
    args = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in args
    try:
        app(args=args, prog_name="edge-agent")
    except EdgeError as exc:
        if debug:
            traceback.print_exc()
        typer.echo(f"error: {exc}", err=True)
        sys.exit(exc.exit_code)
    except KeyboardInterrupt:
        sys.exit(130)


if __name__ == "__main__":
    main()

"""Entry point of ``edgectl``: runs the typer app and turns errors into one line and an exit code."""

from __future__ import annotations

import logging
import sys
import traceback
from collections.abc import Sequence

import typer

from agent.errors import EdgeError, InternalError

# Command modules register themselves on `app` when imported.
from edgectl.cli import (
    access,  # noqa: F401  (users, tokens, api serve)
    analysis,  # noqa: F401  (targets, inspect, partition)
    artifacts,  # noqa: F401  (artifacts serve|publish)
    broker,  # noqa: F401  (broker)
    controller,  # noqa: F401  (controller run)
    fleet,  # noqa: F401  (deploy, devices)
    packages,  # noqa: F401  (keys, build, verify)
    quantize,  # noqa: F401  (quantize)
    rollout,  # noqa: F401  (deploy --fleet, rollout ..., device show)
    security,  # noqa: F401  (pki, device enroll|revoke, broker config)
    sim,  # noqa: F401  (sim)
)
from edgectl.cli.app import app

__all__ = ["main"]


def main(argv: Sequence[str] | None = None) -> None:
    """Run edgectl; exit with the documented code."""
    args = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in args
    logging.basicConfig(
        level=logging.DEBUG if debug else logging.WARNING,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    sys.exit(_run(args, debug))


def _run(args: list[str], debug: bool) -> int:
    # typer handles usage errors (exit 2), --help and typer.Exit itself, ending in SystemExit.
    try:
        app(args=args, prog_name="edgectl")
    except EdgeError as exc:
        return _fail(exc, exc.exit_code, debug)
    except KeyboardInterrupt:
        typer.echo("interrupted", err=True)
        return 130
    except Exception as exc:  # a bug: say so, show the traceback on request
        return _fail(InternalError(f"internal error: {exc!r} (rerun with --debug)"), 1, debug)
    return 0


def _fail(exc: BaseException, code: int, debug: bool) -> int:
    if debug:
        traceback.print_exc()
    message = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    typer.echo(f"error: {message}", err=True)
    return code


if __name__ == "__main__":
    main()

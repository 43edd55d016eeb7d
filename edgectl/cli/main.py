"""Entry point of ``edgectl``: runs the typer app and turns errors into one line and an exit code."""

from __future__ import annotations

import importlib
import importlib.util
import logging
import sys
import traceback
from collections.abc import Sequence

import typer

from edgecore.errors import EdgeError, InternalError, UserError
from edgectl.cli.app import app

__all__ = ["main"]

# Command modules register themselves on `app` when imported.
COMMANDS = (
    "access",  # users, tokens, api serve
    "analysis",  # targets, inspect, partition
    "artifacts",  # artifacts serve|publish
    "broker",  # broker
    "controller",  # controller run
    "device_config",  # device config set|show
    "device_logs",  # device logs
    "fleet",  # deploy, devices
    "groups",  # group create|list|show|add|remove|delete
    "lifecycle",  # device decommission|delete, package list|delete, audit
    "packages",  # keys, build, verify
    "quantize",  # quantize
    "rollout",  # deploy --fleet, rollout ..., device show
    "security",  # pki, device enroll|revoke, broker config
    "sim",  # sim
    "sso",  # sso check
    "webhooks",  # webhook add|list|remove|deliveries|redeliver
)
# What the workstation needs beyond the agent's own dependencies (the `host` extra in pyproject.toml).
HOST_MODULES = ("onnx", "onnxruntime", "openvino", "nncf", "jwt")  # jwt: PyJWT, for single sign-on


def load_commands() -> typer.Typer:
    """Import every command module; a missing host dependency is one line naming the extra to install."""
    try:
        for name in COMMANDS:
            importlib.import_module(f"edgectl.cli.{name}")
    except ModuleNotFoundError as exc:
        if (exc.name or "").split(".")[0] not in HOST_MODULES:
            raise
        missing = [m for m in HOST_MODULES if importlib.util.find_spec(m) is None]
        raise UserError(f"edgectl needs the workstation tools ({', '.join(missing)} not installed): "
                        "pip install 'edgectl[host]'") from None
    return app


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
        load_commands()(args=args, prog_name="edgectl")
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

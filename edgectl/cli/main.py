"""Entry point of ``edgectl``: runs the typer app and turns errors into one line and an exit code."""

from __future__ import annotations

import importlib
import importlib.util
import logging
import os
import sys
import traceback
from collections.abc import Sequence

import typer

from edgecore.errors import EdgeError, InternalError, UserError
from edgectl.cli.app import app

__all__ = ["main"]

# Command modules attach their commands to `app` when imported. Each top-level command, and the modules that attach
# it and everything under it: `edgectl deploy ...` imports only what deploy needs (each module pulls in the controller,
# onnx or numpy: importing all of them cost every call about 0.3 s of CPU). tests/cli/test_lazy_commands.py checks the
# table against the whole command tree.
COMMANDS: dict[str, tuple[str, ...]] = {
    "api": ("access",),  # api serve
    "artifacts": ("artifacts",),
    "audit": ("lifecycle",),
    "broker": ("security",),  # broker, broker config
    "build": ("packages",),
    "controller": ("controller",),
    "deploy": ("fleet",),  # deploy --device, deploy --fleet (rollout)
    "device": ("device_config", "device_logs", "lifecycle", "rollout"),  # enroll|revoke, config, logs, decommission, show
    "devices": ("fleet",),
    "group": ("groups",),
    "inspect": ("analysis",),
    "keys": ("packages",),
    "package": ("lifecycle",),
    "partition": ("analysis",),
    "pipeline": ("packages",),
    "pki": ("security",),
    "quantize": ("quantize",),
    "rollout": ("rollout",),
    "sim": ("sim",),
    "sso": ("sso",),
    "targets": ("analysis",),
    "tokens": ("access",),
    "users": ("access",),
    "verify": ("packages",),
    "webhook": ("webhooks",),
}
# Every command module, in the order `edgectl --help` lists what they attach.
MODULES = ("access", "analysis", "artifacts", "broker", "controller", "device_config", "device_logs", "fleet", "groups",
           "lifecycle", "packages", "quantize", "rollout", "security", "sim", "sso", "webhooks")
_VALUE_OPTIONS = ("--config", "-c", "--broker")  # the root options that take a value (edgectl/cli/app.py)
_COMPLETION = "_EDGECTL_COMPLETE"  # typer's shell completion: every command
# What the workstation needs beyond the agent's own dependencies (the `host` extra in pyproject.toml).
HOST_MODULES = ("onnx", "onnxruntime", "openvino", "nncf", "jwt")  # jwt: PyJWT, for single sign-on


def command_name(args: Sequence[str]) -> str | None:
    """The top-level command ``args`` run (None where they name none, as ``edgectl --help`` does)."""
    rest = iter(args)
    for arg in rest:
        if arg in _VALUE_OPTIONS:
            next(rest, None)
        elif not arg.startswith("-"):
            return arg
    return None


def load_commands(args: Sequence[str] | None = None) -> typer.Typer:
    """Import the command modules ``args`` need (every one without args, for no or an unknown command, and for
    completion)."""
    name = None if args is None or _COMPLETION in os.environ else command_name(args)
    for module in COMMANDS.get(name or "", MODULES):
        importlib.import_module(f"edgectl.cli.{module}")
    return app


def host_tools_missing(exc: ModuleNotFoundError) -> UserError | None:
    """The one-line error naming the extra to install, when ``exc`` is a workstation module missing; else None."""
    if (exc.name or "").split(".")[0] not in HOST_MODULES:
        return None
    missing = [m for m in HOST_MODULES if importlib.util.find_spec(m) is None] or [(exc.name or "").split(".")[0]]
    return UserError(f"edgectl needs the workstation tools ({', '.join(missing)} not installed): "
                     "pip install 'edgectl[host]'")


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
        load_commands(args)(args=args, prog_name="edgectl")
    except EdgeError as exc:
        return _fail(exc, exc.exit_code, debug)
    except KeyboardInterrupt:
        typer.echo("interrupted", err=True)
        return 130
    except ModuleNotFoundError as exc:  # a command module, or a command as it runs, needs the host extra
        missing = host_tools_missing(exc)
        if missing is not None:
            return _fail(missing, missing.exit_code, debug)
        return _fail(InternalError(f"internal error: {exc!r} (rerun with --debug)"), 1, debug)
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

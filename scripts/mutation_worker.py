"""One mutation worker: imports the test tools once, then runs each mutant's tests in a forked child.

Started by ``scripts/mutation_run.py`` in a private copy of the repository (its working directory,
compiled to hash-checked ``.pyc`` files so that a module's cache can never outlive its source).
It reads one job per line on stdin, JSON ``{"path", "source", "tests", "timeout"}`` (``source``
null: the unmutated module, a baseline run), writes the mutated source, runs pytest on the
job's tests in a forked child (its own process group, killed as a whole at the timeout),
restores the file, and answers one JSON line: ``{"outcome", "rc", "seconds", "tail", "conftest_broken"}``.

It never imports the project's code itself: each child imports the (mutated) tree afresh, while
the third-party libraries and pytest's plugins, imported here once, are shared by every fork.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
import time
import traceback
from importlib import import_module
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any

PRELOAD = ("numpy", "yaml", "cryptography.hazmat.primitives.asymmetric.ed25519", "hypothesis", "pytest", "paho.mqtt.client",
           "prometheus_client", "onnx", "onnxruntime")
PYTEST_ARGS = ["-x", "-q", "--no-header", "-p", "no:cacheprovider", "-o", "addopts=", "--hypothesis-seed=0"]
LOG = Path(".mutation-child.log")


def preload() -> None:
    """Import what every child would import anyway, so that a fork starts with it."""
    for name in PRELOAD:
        with contextlib.suppress(ImportError):
            import_module(name)
    for plugin in entry_points(group="pytest11"):
        with contextlib.suppress(Exception):
            plugin.load()


def _child(tests: list[str]) -> None:
    """In the forked child: pytest on ``tests``, output to the log, then exit with its code."""
    code = 99
    try:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)  # the worker's stop handler is not the child's
        os.setsid()
        out = os.open(LOG, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(out, 1)
        os.dup2(out, 2)
        import pytest

        code = int(pytest.main([*PYTEST_ARGS, *tests]))
    except BaseException:  # whatever happens, the child must not return into the worker's loop
        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def _kill_group(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)


_RUNNING: list[int] = []  # the child now running, for the stop handler


def _stop(_signum: int, _frame: object) -> None:
    """Told to stop (the runner was interrupted): take the running child's whole group along, then go."""
    for pid in _RUNNING:
        _kill_group(pid)
    os._exit(1)


def run_tests(tests: list[str], timeout: float) -> tuple[str, int, float]:
    """(outcome, exit code, seconds): ``passed``, ``failed`` (any non-zero pytest code) or ``timeout``."""
    start = time.monotonic()
    pid = os.fork()
    if pid == 0:
        _child(tests)
    _RUNNING[:] = [pid]
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        if time.monotonic() - start > timeout:
            _kill_group(pid)
            os.waitpid(pid, 0)
            return "timeout", -9, time.monotonic() - start
        time.sleep(0.01)
    _kill_group(pid)  # what its tests started and left behind (a broker, an agent) goes with it
    code = os.waitstatus_to_exitcode(status)
    return ("passed" if code == 0 else "failed"), code, time.monotonic() - start


def _tail(why: bool = False) -> str:
    """The log's last lines; ``why``: the failure's own lines (source and E lines) first, not the warnings summary."""
    try:
        lines = LOG.read_text(errors="replace").splitlines()
    except OSError:
        return ""
    failure = [line for line in lines if line.startswith(("E ", "> ", "FAILED", "ERROR"))][-30:] if why else []
    return "\n".join(failure + lines[-3 if failure else -15:])


def _conftest_broken(code: int) -> bool:
    """pytest's exit 4 because a conftest could not be imported (not a usage error of the runner's own making)."""
    try:
        return code == 4 and "ImportError while loading conftest" in LOG.read_text(errors="replace")
    except OSError:
        return False


def handle(job: dict[str, Any], originals: dict[str, bytes]) -> dict[str, Any]:
    path = Path(job["path"])
    original = originals.setdefault(job["path"], path.read_bytes())
    try:
        if job["source"] is not None:
            path.write_text(job["source"])
        outcome, code, seconds = run_tests(job["tests"], float(job["timeout"]))
    finally:
        path.write_bytes(original)
    # A failing baseline always says why (its tests must pass); a mutant's ordinary failure (1) needs no tail.
    wanted = code != 0 if job["source"] is None else code not in (0, 1)
    return {"outcome": outcome, "rc": code, "seconds": round(seconds, 3), "tail": _tail(job["source"] is None) if wanted else "",
            "conftest_broken": _conftest_broken(code)}


def main() -> None:
    sys.path.insert(0, os.getcwd())
    signal.signal(signal.SIGTERM, _stop)
    preload()
    originals: dict[str, bytes] = {}
    print(json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        print(json.dumps(handle(json.loads(line), originals)), flush=True)


if __name__ == "__main__":
    main()

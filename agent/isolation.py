"""Run an agent module in a child process and follow what it says: a crash, a hang or a stop ends the child, not us.

The same isolation staging uses (``agent.deploy.stage``, ``edgecore.sandbox``), for work that runs a
runtime on a model this process has not run yet: a runtime that aborts (OpenVINO's ``free():
invalid pointer`` on a string model), segfaults or hangs takes only the child down, and the
caller learns how the child ended and what it said last.

The child speaks JSON lines through ``ChildChannel``, which moves its own stdout aside first, so
that whatever a runtime prints goes to stderr with the rest. Its stderr is kept in a temporary file
whose tail explains a crash; ``LIBC_FATAL_STDERR_=1`` sends glibc's fatal messages there too
instead of to the terminal. The caller may lower the child's priority (``nice``): it then takes
only the CPU time nothing else wants.
"""

from __future__ import annotations

import json
import os
import selectors
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TextIO

__all__ = ["NICE_ENV", "ChildChannel", "ChildExit", "run_child"]

NICE_ENV = "EDGE_CHILD_NICE"  # outside the EDGE_AGENT_ prefix: that one is the configuration's
TAIL_CHARS = 300


@dataclass(frozen=True)
class ChildExit:
    """How a child ended: the messages it sent, its exit status, and whether we stopped it (timeout or request)."""

    messages: tuple[dict[str, Any], ...]
    returncode: int | None
    stderr_tail: str = ""
    timed_out: bool = False
    stopped: bool = False  # ``keep_going`` said no
    timeout_s: float = 0.0

    @property
    def signal(self) -> str | None:
        """The signal that killed the child (``SIGABRT``), when one did and it was not ours."""
        if self.returncode is None or self.returncode >= 0 or self.timed_out or self.stopped:
            return None
        try:
            return signal.Signals(-self.returncode).name
        except ValueError:
            return f"signal {-self.returncode}"

    def how(self) -> str:
        """How it ended, for a one-line reason: ``crashed (SIGABRT)``, ``exited with status 3``, ..."""
        if self.timed_out:
            return f"did not finish within {self.timeout_s:g} s"
        if self.stopped:
            return "was stopped"
        if self.signal is not None:
            return f"crashed ({self.signal})"
        return f"exited with status {self.returncode}"


def run_child(
    module: str,
    args: Sequence[str],
    *,
    timeout_s: float,
    keep_going: Callable[[], bool] | None = None,
    on_message: Callable[[dict[str, Any]], None] | None = None,
    nice: int = 0,
    poll_s: float = 0.1,
) -> ChildExit:
    """Run ``python -m module args...``; hand each message to ``on_message`` as it comes.

    The child is killed when ``timeout_s`` passes or, checked every ``poll_s``, ``keep_going()``
    turns false.
    """
    env = {**os.environ, "LIBC_FATAL_STDERR_": "1", NICE_ENV: str(nice)}
    messages: list[dict[str, Any]] = []
    with tempfile.TemporaryFile() as err:
        proc = subprocess.Popen([sys.executable, "-m", module, *args], stdin=subprocess.DEVNULL,
                                stdout=subprocess.PIPE, stderr=err, env=env)
        try:
            why = _follow(proc, time.monotonic() + timeout_s, keep_going, poll_s, messages, on_message)
        finally:
            if proc.poll() is None:
                proc.kill()
            proc.wait()
            if proc.stdout is not None:
                proc.stdout.close()
        err.seek(0)
        tail = " ".join(err.read().decode(errors="replace").split())[-TAIL_CHARS:]
    return ChildExit(tuple(messages), None if why else proc.returncode, tail, why == "timeout", why == "stopped",
                     timeout_s)


def _follow(proc: subprocess.Popen[bytes], deadline: float, keep_going: Callable[[], bool] | None, poll_s: float,
            messages: list[dict[str, Any]], on_message: Callable[[dict[str, Any]], None] | None) -> str | None:
    """Read the child's lines until it closes its end; "timeout" or "stopped" when we ended it first."""
    assert proc.stdout is not None
    fd = proc.stdout.fileno()
    pending = b""
    with selectors.DefaultSelector() as selector:
        selector.register(fd, selectors.EVENT_READ)
        while True:
            if keep_going is not None and not keep_going():
                return "stopped"
            left = deadline - time.monotonic()
            if left <= 0:
                return "timeout"
            if not selector.select(min(poll_s, left)):
                continue
            chunk = os.read(fd, 65536)
            if not chunk:
                break
            *lines, pending = (pending + chunk).split(b"\n")
            for line in lines:
                message = _message(line)
                if message is not None:
                    messages.append(message)
                    if on_message is not None:
                        on_message(message)
    try:
        proc.wait(max(deadline - time.monotonic(), 0.0))
    except subprocess.TimeoutExpired:
        return "timeout"
    return None


def _message(line: bytes) -> dict[str, Any] | None:
    try:
        value = json.loads(line)
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


class ChildChannel:
    """The child's side: JSON lines to the parent on the real stdout, everything else printed goes to stderr."""

    def __init__(self) -> None:
        self._out: TextIO = os.fdopen(os.dup(1), "w", buffering=1)
        os.dup2(2, 1)  # a runtime printing to stdout must not break the protocol
        sys.stdout = sys.stderr
        nice = int(os.environ.get(NICE_ENV, "0") or 0)
        if nice:
            os.nice(nice)

    def send(self, message: dict[str, Any]) -> None:
        """One message, flushed at once: the parent may need it to explain a crash a moment later."""
        self._out.write(json.dumps(message) + "\n")
        self._out.flush()

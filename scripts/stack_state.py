"""What ``./scripts/stack up`` started, saved as ``stack.json`` in the stack's directory, and its processes.

Every long-running part is a process of its own, started in a new session with its output in
``logs/NAME.log``; ``stack.json`` names each one (pid, port, log) and where to reach the stack (the
operator's config, the controllers' API, the broker URLs, an admin token), so ``down`` and ``status``
and the tests (tests/assembly) read the same record.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["Proc", "StackState", "free_port", "spawn", "stop_all", "wait_port"]

STATE_FILE = "stack.json"


@dataclass
class Proc:
    """One process of the stack: ``port`` is what it listens on (0 when nothing)."""

    name: str
    pid: int
    log: str
    port: int = 0

    def alive(self) -> bool:
        try:
            os.kill(self.pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return _not_a_zombie(self.pid)

    def stop(self, sig: int = signal.SIGTERM, grace_s: float = 20.0) -> None:
        """Signal the process's session (its children too), then SIGKILL it after ``grace_s``."""
        stop_all([self], sig, grace_s)

    def signal(self, sig: int) -> None:
        """``sig`` to the process's session (its children too); nothing when it is gone."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.pid, sig)


def stop_all(procs: Sequence[Proc], sig: int = signal.SIGTERM, grace_s: float = 20.0) -> None:
    """Signal every process's session at once, wait up to ``grace_s`` for all, then SIGKILL what remains."""
    for each in (sig, signal.SIGKILL):
        running = [p for p in procs if p.alive()]
        for proc in running:
            proc.signal(each)
        deadline = time.monotonic() + grace_s
        while time.monotonic() < deadline and any(p.alive() for p in running):
            time.sleep(0.1)


def _not_a_zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


@dataclass
class StackState:
    """The running stack: its parts and how to reach them."""

    dir: str
    broker: str  # nats | mosquitto
    broker_urls: list[str]
    store_url: str
    operator_home: str  # EDGECTL_HOME with the keys and the PKI
    operator_config: str  # edgectl.yaml naming the store, the brokers and the controller's TLS identity
    admin_token: str = ""
    api_urls: list[str] = field(default_factory=list)  # each controller replica's http://host:port
    artifact_url: str = ""
    artifact_dir: str = ""
    prometheus_url: str = ""
    pg_root: str = ""  # PostgreSQL's directory (stopped with pg_ctl)
    pg_bin: str = ""
    pg_run_as: list[str] = field(default_factory=list)
    agents: list[str] = field(default_factory=list)  # device ids of the real edge-agent processes
    sims: list[str] = field(default_factory=list)  # device ids of the simulated devices
    procs: dict[str, Proc] = field(default_factory=dict)

    @property
    def path(self) -> Path:
        return Path(self.dir) / STATE_FILE

    def env(self) -> dict[str, str]:
        """What an edgectl command needs to act as this stack's operator."""
        return {"EDGECTL_HOME": self.operator_home, "EDGECTL_CONFIG": self.operator_config}

    def save(self) -> None:
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(asdict(self), indent=1))
        tmp.replace(self.path)

    @classmethod
    def load(cls, directory: Path) -> StackState | None:
        try:
            raw: dict[str, Any] = json.loads((directory / STATE_FILE).read_text())
        except (OSError, ValueError):
            return None
        raw["procs"] = {name: Proc(**p) for name, p in raw.get("procs", {}).items()}
        return cls(**raw)

    def add(self, proc: Proc) -> Proc:
        self.procs[proc.name] = proc
        self.save()
        return proc


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait_port(port: int, timeout: float, proc: Proc | None = None) -> None:
    """Until 127.0.0.1:port accepts a connection; RuntimeError naming the log when ``proc`` died or time ran out."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return
        except OSError:
            if proc is not None and not proc.alive():
                raise RuntimeError(f"{proc.name} exited: see {proc.log}") from None
            time.sleep(0.1)
    raise RuntimeError(f"nothing listens on 127.0.0.1:{port} after {timeout:.0f}s" + (f": see {proc.log}" if proc else ""))


def spawn(name: str, argv: Sequence[str], logs: Path, env: Mapping[str, str] | None = None, cwd: Path | None = None,
          port: int = 0) -> Proc:
    """Start ``argv`` in a session of its own (so ``down`` ends it with its children), output to logs/NAME.log."""
    logs.mkdir(parents=True, exist_ok=True)
    log = logs / f"{name}.log"
    with log.open("ab") as out:
        process = subprocess.Popen(list(argv), stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                   env=dict(env) if env is not None else None, cwd=cwd, start_new_session=True)
    return Proc(name, process.pid, str(log), port)

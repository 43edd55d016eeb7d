"""Real agents for tests: each `edge-agent run` is a subprocess with its own state directory."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from edgectl.keys import ROLES, Keyring
from tests.brokers import free_port
from tests.checkout import checkout_env

__all__ = ["AgentProcess", "EdgectlHome", "wait_for"]


def wait_for(condition: Callable[[], Any], timeout: float, what: str, interval: float = 0.1) -> Any:
    """Poll ``condition`` until it returns something truthy; fail the test with ``what`` otherwise."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


@dataclass
class EdgectlHome:
    """An $EDGECTL_HOME with signing keys, and a way to run edgectl against a broker."""

    path: Path
    broker_url: str

    def env(self) -> dict[str, str]:
        return checkout_env(EDGECTL_HOME=str(self.path), EDGECTL_BROKER=self.broker_url, PYTHONUNBUFFERED="1")

    def edgectl(self, *args: str, timeout: float = 120, check: bool = False) -> subprocess.CompletedProcess[str]:
        proc = subprocess.run([sys.executable, "-m", "edgectl.cli.main", *args], env=self.env(), text=True,
                              capture_output=True, timeout=timeout, cwd=self.path)
        if check and proc.returncode != 0:
            raise AssertionError(f"edgectl {' '.join(args)} exited {proc.returncode}:\n{proc.stdout}\n{proc.stderr}")
        return proc

    def init_keys(self) -> None:
        """What `edgectl keys init` does, in this process (a CLI run per test cost more CPU than most tests; the
        command itself is run by the docs' tests)."""
        ring = Keyring(self.path / "keys")
        for role in ROLES:
            ring.init(role)

    def public_key(self, role: str) -> Path:
        """The role's public key as `edgectl keys export ROLE -o` writes it (in this process, as init_keys)."""
        out = self.path / f"{role}.pub.pem"
        if not out.exists():
            out.write_text(Keyring(self.path / "keys").public_pem(role, None))
        return out


@dataclass
class AgentProcess:
    """One edge-agent daemon in its own process."""

    device_id: str
    workdir: Path
    broker_url: str
    package_keys: list[Path]
    controller_keys: list[Path]
    target: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    env_extra: dict[str, str] = field(default_factory=dict)
    process: subprocess.Popen[bytes] | None = None
    http_port: int = 0
    python: str = sys.executable  # the interpreter that runs the agent (a lean venv's in tests/devices)

    @property
    def state_dir(self) -> Path:
        return self.workdir / "state"

    @property
    def log(self) -> Path:
        return self.workdir / "agent.log"

    def write_config(self) -> Path:
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.http_port = self.http_port or free_port()
        config = {
            "device_id": self.device_id, "broker": self.broker_url, "state_dir": str(self.state_dir),
            "trust": {"packages": [str(p) for p in self.package_keys], "controllers": [str(p) for p in self.controller_keys]},
            "target": self.target,
            "inference": {"port": self.http_port}, "telemetry_interval_s": 1.0,
            "deploy": {"request_interval_s": 1.0, "selection_budget_s": 0.5, "health_runs": 5},
            **self.extra,
        }
        path = self.workdir / "agent.yaml"
        path.write_text(yaml.safe_dump(config))
        return path

    def start(self) -> AgentProcess:
        config = self.write_config()
        with self.log.open("ab") as out:
            self.process = subprocess.Popen(
                [self.python, "-m", "agent.cli.main", "run", "--config", str(config), *self.extra_args()],
                stdout=out, stderr=subprocess.STDOUT, env=self.env(),
            )
        wait_for(self.ready, 60, f"{self.device_id}'s inference API")
        return self

    def env(self) -> dict[str, str]:
        """The agent's environment: this checkout's code first, then ``env_extra``."""
        return checkout_env(PYTHONUNBUFFERED="1", **self.env_extra)

    def extra_args(self) -> list[str]:
        """Command-line arguments added after ``run --config FILE`` (a seam for test hooks)."""
        return []

    def ready(self) -> bool:
        if self.process is not None and self.process.poll() is not None:
            raise AssertionError(f"agent {self.device_id} exited with {self.process.returncode}:\n{self.log_text()[-3000:]}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.http_port}/v2/health/live", timeout=1) as r:
                return bool(r.status == 200)
        except OSError:
            return False

    def model_ready(self, name: str) -> bool:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.http_port}/v2/models/{name}/ready", timeout=1) as r:
                return bool(r.status == 200)
        except OSError:
            return False

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def stop(self, sig: int = signal.SIGTERM) -> int | None:
        if self.process is None:
            return None
        if self.process.poll() is None:
            self.process.send_signal(sig)
            try:
                self.process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        code = self.process.returncode
        self.process = None
        return code

    def kill(self) -> None:
        self.stop(signal.SIGKILL)

    def log_text(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    def active(self, name: str | None = None) -> dict[str, Any] | None:
        """The slot pointer's active model ``name`` (None: the device's only model), or None."""
        try:
            models = json.loads((self.state_dir / "models.json").read_text())["models"]
        except (OSError, ValueError, KeyError):
            return None
        if name is None:
            name = next(iter(models)) if len(models) == 1 else None
        active: dict[str, Any] | None = models[name]["active"] if name in models else None
        return active

    def active_version(self, name: str | None = None) -> int | None:
        """The active model's version, None before the first commit."""
        active = self.active(name)
        version: int | None = None if active is None else active["version"]
        return version

    def http(self, path: str, body: bytes | None = None) -> Any:
        request = urllib.request.Request(f"http://127.0.0.1:{self.http_port}{path}", data=body,
                                         headers={"Content-Type": "application/json"} if body else {})
        with urllib.request.urlopen(request, timeout=30) as r:
            return json.loads(r.read())

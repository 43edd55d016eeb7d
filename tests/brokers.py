"""Start real MQTT brokers for tests: Mosquitto on a free port, or the embedded amqtt broker."""

from __future__ import annotations

import shutil
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from tests.checkout import checkout_env

__all__ = ["BrokerProcess", "free_port", "start_embedded", "start_mosquitto", "wait_port"]


def free_port() -> int:
    """A TCP port that was free on 127.0.0.1 a moment ago."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait_port(port: int, timeout: float = 10.0) -> None:
    """Wait until something accepts TCP connections on 127.0.0.1:port."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.05)
    raise TimeoutError(f"nothing listens on 127.0.0.1:{port} after {timeout}s")


@dataclass
class BrokerProcess:
    """A broker running in its own process; restartable on the same port."""

    argv: list[str]
    port: int
    log: Path
    process: subprocess.Popen[bytes] | None = field(default=None)
    env: dict[str, str] | None = None  # None: this process's environment
    ready_s: float = 10.0  # how long start() waits for the port

    @property
    def url(self) -> str:
        return f"mqtt://127.0.0.1:{self.port}"

    def start(self) -> BrokerProcess:
        with self.log.open("ab") as out:
            self.process = subprocess.Popen(self.argv, stdout=out, stderr=subprocess.STDOUT, env=self.env)
        wait_port(self.port, self.ready_s)
        return self

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.process = None

    def restart(self, down_for: float = 0.0) -> None:
        self.stop()
        time.sleep(down_for)
        self.start()


def mosquitto_binary() -> str | None:
    return shutil.which("mosquitto") or next(
        (p for p in ("/usr/sbin/mosquitto", "/usr/local/sbin/mosquitto") if Path(p).exists()), None
    )


def start_mosquitto(workdir: Path, extra_config: str = "", port: int | None = None) -> BrokerProcess:
    """Start Mosquitto with a config written for this test; ``extra_config`` is appended.

    Without ``extra_config`` the broker has one plaintext listener on 127.0.0.1 that allows
    anonymous clients. A config that defines its own listener passes ``port`` and includes it.
    """
    binary = mosquitto_binary()
    if binary is None:
        raise RuntimeError("mosquitto is not installed: run ./scripts/test, or apt-get install mosquitto")
    workdir.mkdir(parents=True, exist_ok=True)
    port = port or free_port()
    conf = workdir / "mosquitto.conf"
    base = "" if extra_config and "listener" in extra_config else f"listener {port} 127.0.0.1\nallow_anonymous true\n"
    conf.write_text(base + "persistence false\nlog_dest stdout\n" + extra_config)
    return BrokerProcess([binary, "-c", str(conf)], port, workdir / "mosquitto.log").start()


def start_embedded(workdir: Path, port: int | None = None) -> BrokerProcess:
    """Start the embedded amqtt broker (`edgectl broker`) in its own process."""
    workdir.mkdir(parents=True, exist_ok=True)
    port = port or free_port()
    argv = [sys.executable, "-m", "edgectl.cli.main", "broker", "--port", str(port)]
    # A Python process importing edgectl: seconds on a loaded 2-core machine, not the milliseconds of Mosquitto.
    return BrokerProcess(argv, port, workdir / "embedded-broker.log", env=checkout_env(), ready_s=60.0).start()

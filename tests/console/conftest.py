"""One control plane for the console's browser tests: Mosquitto, `edgectl controller run --http`, `edgectl sim`,
tokens for each role, and a headless Chromium (started once per module: each costs seconds on 2 cores)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from edgecore.protocol.manifest import TargetInfo
from edgectl.examples import tiny_classifier
from edgectl.keys import Keyring
from edgectl.package import BuildOptions, build_package
from tests.brokers import BrokerProcess, free_port, mosquitto_binary, start_mosquitto, wait_port
from tests.console.browser import Browser, missing
from tests.fleet import EdgectlHome, wait_for

# The simulated fleet: three profiles, so that each test rolls out to its own devices by target.
PROFILES = {"cpu-x86": 3, "nnapi": 2, "jetson-orin": 2, "qnn-htp": 3}
ROLES = ("viewer", "operator", "admin")
# Set to a folder to save screenshots of the main pages there (scripts/screenshots sets it to docs/images).
SCREENSHOTS = os.environ.get("CONSOLE_SCREENSHOTS")


@dataclass
class ConsolePlane:
    home: EdgectlHome
    broker: BrokerProcess
    url: str  # http://127.0.0.1:PORT
    log: Path
    processes: list[subprocess.Popen[bytes]] = field(default_factory=list)
    tokens: dict[str, str] = field(default_factory=dict)  # role -> bearer token

    @property
    def console(self) -> str:
        return f"{self.url}/console/"

    def package(self, name: str, version: int, latency_factor: float = 1.0) -> Path:
        """A signed package built in process with the home's package key (uploaded through the browser)."""
        onnx = tiny_classifier(self.home.path / f"{name}-{version}.onnx")
        out = self.home.path / f"{name}-{version}.edgepkg"
        build_package(onnx, BuildOptions(name, version, TargetInfo("any"), golden_samples=0),
                      Keyring(self.home.path / "keys").signing_key("package"), out)
        return out

    def api(self, method: str, path: str, role: str = "operator", body: Any = None, raw: bytes | None = None) -> tuple[int, Any]:
        """Call the REST API directly (setup and checks the browser does not need to make)."""
        data = raw if raw is not None else json.dumps(body).encode() if body is not None else None
        headers = {"Authorization": f"Bearer {self.tokens[role]}",
                   "Content-Type": "application/octet-stream" if raw is not None else "application/json"}
        request = urllib.request.Request(f"{self.url}/api/v1{path}", data, headers, method=method)
        try:
            with urllib.request.urlopen(request, timeout=30) as response:
                return response.status, json.loads(response.read() or b"null")
        except urllib.error.HTTPError as exc:
            return exc.code, json.loads(exc.read() or b"null")

    def alive(self) -> None:
        for process in self.processes:
            if process.poll() is not None:
                raise AssertionError(f"{process.args!r} exited {process.returncode}:\n{self.log.read_text()[-3000:]}")

    def stop(self) -> None:
        for process in reversed(self.processes):
            if process.poll() is None:
                process.terminate()
                try:
                    process.wait(20)
                except subprocess.TimeoutExpired:
                    process.kill()
                    process.wait()


def _start(plane: ConsolePlane, *args: str) -> subprocess.Popen[bytes]:
    with plane.log.open("ab") as out:
        process = subprocess.Popen([sys.executable, "-m", "edgectl.cli.main", *args], env=plane.home.env(),
                                   cwd=plane.home.path, stdout=out, stderr=subprocess.STDOUT)
    plane.processes.append(process)
    return process


def start_plane(root: Path, broker: BrokerProcess, config: dict[str, Any] | None = None) -> ConsolePlane:
    """Keys, users and tokens for each role, the controller with its HTTP API (``config``: its edgectl.yaml, if any),
    and the simulated fleet, all online."""
    home = EdgectlHome(root / "home", broker.url)
    home.path.mkdir(parents=True)
    if config is not None:
        (home.path / "edgectl.yaml").write_text(json.dumps(config))  # JSON is YAML
    home.init_keys()
    port = free_port()
    plane = ConsolePlane(home, broker, f"http://127.0.0.1:{port}", root / "processes.log")
    for role in ROLES:
        home.edgectl("users", "add", role, "--role", role, check=True)
        plane.tokens[role] = json.loads(home.edgectl("tokens", "create", role, "--json", check=True).stdout)["token"]
    _start(plane, "controller", "run", "--http", f"127.0.0.1:{port}")
    _start(plane, "sim", "--profiles", ",".join(f"{p}:{n}" for p, n in PROFILES.items()), "--tag", "site=lab",
           "--telemetry-s", "1", "--state-dir", str(root / "sim"))
    wait_port(port, 60)
    total = sum(PROFILES.values())

    def online() -> bool:
        plane.alive()
        status, summary = plane.api("GET", "/fleet/summary", "viewer")
        return status == 200 and summary["by_status"].get("online", 0) == total
    wait_for(online, 60, f"{total} simulated devices online in the controller")
    return plane


@pytest.fixture(scope="module")
def plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ConsolePlane]:
    if mosquitto_binary() is None:
        pytest.fail("mosquitto is not installed: ./scripts/test installs it (apt-get install mosquitto)")
    root = tmp_path_factory.mktemp("console")
    broker = start_mosquitto(root / "mosquitto")
    plane = None
    try:
        plane = start_plane(root, broker)
        yield plane
    finally:
        if plane is not None:
            plane.stop()
        broker.stop()


@pytest.fixture(scope="module")
def browser(plane: ConsolePlane) -> Iterator[Browser]:
    reason = missing()
    if reason:
        pytest.skip(reason)
    started = Browser(plane.console)
    try:
        yield started
    finally:
        started.close()


def screenshot(browser: Browser, name: str, settle_s: float = 0.0) -> None:
    """Save the page as console-NAME.png in the folder CONSOLE_SCREENSHOTS names, if any (after ``settle_s``)."""
    if SCREENSHOTS:
        time.sleep(settle_s)
        browser.screenshot(Path(SCREENSHOTS) / f"console-{name}.png")

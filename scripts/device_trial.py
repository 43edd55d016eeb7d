"""Try the installed agent on a "device" as a user would, from this host: probe, deploy, infer, compare.

The device is a command that starts its Python (``chroot ROOT /opt/edge-agent/bin/python`` for the
emulated arm64 root file system of ./scripts/test-arm64, a venv's python for the fast test) and a
directory both sides see (``--exchange HOST_DIR:DEVICE_DIR``). The device shares this host's network,
so the agent reaches the broker started here on 127.0.0.1 and the host reaches the agent's HTTP API.
With ``--service UNIT`` the agent is not started by this script but by its unit (``systemctl start``),
with its config, keys and state where the Debian package puts them (./scripts/test-deb).

Steps, each timed: ``edge-agent probe --model`` on a small model; the agent started with a config
trusting this host's keys; ``edgectl deploy`` to it through a Mosquitto started here; the first
inference over HTTP, compared with onnxruntime on this host (rtol 1e-4, atol 1e-5). Prints the
figures as one JSON object; exits 5 when the device's answers differ.

    python scripts/device_trial.py --device-python /path/venv/bin/python --exchange /tmp/x:/tmp/x
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import yaml

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # run as a script: the checkout's packages
    sys.path.insert(0, str(REPO))

from edgectl.examples import tiny_classifier  # noqa: E402
from tests.brokers import free_port, start_mosquitto  # noqa: E402

__all__ = ["Exchange", "Launcher", "ProcessLauncher", "ServiceLauncher", "agent_config", "answers_match", "main", "trial"]

RTOL, ATOL = 1e-4, 1e-5


@dataclass(frozen=True)
class Exchange:
    """One directory as the host and the device name it."""

    host: Path
    device: Path

    @classmethod
    def parse(cls, text: str) -> Exchange:
        host, sep, device = text.partition(":")
        if not sep or not host or not device:
            raise SystemExit(f"--exchange {text!r}: expected HOST_DIR:DEVICE_DIR")
        return cls(Path(host), Path(device))

    def on_device(self, path: Path) -> str:
        return str(self.device / path.relative_to(self.host))


def agent_config(device_id: str, broker_port: int, http_port: int, config_dir: str, state_dir: str) -> dict[str, Any]:
    """The agent.yaml the device runs: this host's broker, the keys beside the config (as the device names them)."""
    return {
        "device_id": device_id, "broker": f"mqtt://127.0.0.1:{broker_port}", "state_dir": state_dir,
        "trust": {"packages": [f"{config_dir}/package.pub.pem"], "controllers": [f"{config_dir}/controller.pub.pem"]},
        "inference": {"port": http_port}, "telemetry_interval_s": 5.0,
        # Emulated CPUs are slow: a longer staging limit and a short measurement budget.
        "deploy": {"request_interval_s": 2.0, "selection_budget_s": 1.0, "stage_timeout_s": 600},
    }


class Launcher:
    """Where the agent's config goes and how it starts and stops."""

    config_dir: Path  # as this host sees it
    device_config_dir: str  # as the device sees it
    state_dir: str  # as the device sees it

    def start(self, config: Path, log: Path) -> None:
        raise NotImplementedError

    def alive(self) -> bool:
        raise NotImplementedError

    def stop(self) -> None:
        raise NotImplementedError


class ProcessLauncher(Launcher):
    """``python -m agent.cli.main run`` on the device, config and state in the exchange directory."""

    def __init__(self, device_python: list[str], exchange: Exchange) -> None:
        self.device_python, self.exchange = device_python, exchange
        self.config_dir, self.device_config_dir = exchange.host, str(exchange.device)
        self.state_dir = exchange.on_device(exchange.host / "state")
        self.process: subprocess.Popen[bytes] | None = None

    def start(self, config: Path, log: Path) -> None:
        with log.open("ab") as out:
            self.process = subprocess.Popen([*self.device_python, "-m", "agent.cli.main", "run", "--config",
                                             self.exchange.on_device(config)], stdout=out, stderr=subprocess.STDOUT)

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def stop(self) -> None:
        if self.process is not None:
            self.process.terminate()
            self.process.wait(60)


class ServiceLauncher(Launcher):
    """The agent's unit, started by the supervisor named ``systemctl`` on PATH, with the package's paths."""

    def __init__(self, unit: str, config_dir: Path = Path("/etc/edge-agent"), state_dir: str = "/var/lib/edge-agent"):
        self.unit, self.config_dir, self.device_config_dir, self.state_dir = unit, config_dir, str(config_dir), state_dir

    def start(self, config: Path, log: Path) -> None:
        subprocess.run(["systemctl", "start", self.unit], check=True, timeout=120)

    def alive(self) -> bool:
        return subprocess.run(["systemctl", "is-active", "--quiet", self.unit], timeout=60).returncode == 0

    def stop(self) -> None:
        subprocess.run(["systemctl", "stop", self.unit], check=True, timeout=120)


def answers_match(got: np.ndarray, want: np.ndarray) -> tuple[bool, float]:
    """Whether the device's output equals the host's within float tolerance, and the largest difference."""
    diff = float(np.max(np.abs(got.astype(np.float64) - want.astype(np.float64)))) if want.size else 0.0
    return got.shape == want.shape and bool(np.allclose(got, want, rtol=RTOL, atol=ATOL)), diff


def trial(device_python: list[str], exchange: Exchange, launcher: Launcher, timeout_s: float,
          progress: Callable[[str], None]) -> dict[str, Any]:
    """Run every step; the figures as a dict (``match`` says whether the answers agreed)."""
    import onnxruntime as ort

    figures: dict[str, Any] = {}
    model = tiny_classifier(exchange.host / "classifier.onnx", seed=11)
    golden = exchange.host / "golden"
    golden.mkdir(exist_ok=True)
    np.save(golden / "sample.npy", np.random.default_rng(4).standard_normal((1, 3, 32, 32)).astype(np.float32))
    progress("probe")
    start = time.monotonic()
    probe = _device(device_python, ["-m", "agent.cli.main", "probe", "--json", "--model", exchange.on_device(model),
                                    "--golden", exchange.on_device(golden), "--budget", "1"], timeout_s)
    figures["probe_s"] = round(time.monotonic() - start, 1)
    report = json.loads(probe)
    figures.update(arch=report["hardware"]["cpu"]["arch"], runtimes=report["runtimes"],
                   probe_backend=report["selection"]["backend"],
                   ready_profiles=sorted(k for k, v in report["profiles"].items() if v["status"] == "ready"))
    with tempfile.TemporaryDirectory() as work:
        home = Path(work) / "home"
        home.mkdir()
        broker = start_mosquitto(Path(work) / "mosquitto")
        started = False
        try:
            env = {"EDGECTL_HOME": str(home), "EDGECTL_BROKER": broker.url, "PYTHONPATH": str(REPO)}
            _edgectl(env, "keys", "init")
            for role in ("package", "controller"):
                _edgectl(env, "keys", "export", role, "-o", str(launcher.config_dir / f"{role}.pub.pem"))
            http_port = free_port()
            config = launcher.config_dir / "agent.yaml"
            settings = agent_config("arm-1", broker.port, http_port, launcher.device_config_dir, launcher.state_dir)
            config.write_text(yaml.safe_dump(settings))
            config.chmod(0o644)
            progress("agent start")
            start = time.monotonic()
            launcher.start(config, exchange.host / "agent.log")
            started = True
            _wait(lambda: _get(http_port, "/v2/health/live") is not None, timeout_s, "the agent's HTTP API", launcher)
            figures["agent_start_s"] = round(time.monotonic() - start, 1)
            progress("deploy")
            start = time.monotonic()
            _edgectl(env, "deploy", str(model), "--device", "arm-1", "--name", "classifier", "--version", "1",
                     "--timeout", str(int(timeout_s)))
            figures["deploy_s"] = round(time.monotonic() - start, 1)
            x = np.random.default_rng(5).standard_normal((1, 3, 32, 32)).astype(np.float32)
            start = time.monotonic()
            got = _infer(http_port, x)
            figures["first_inference_ms"] = round((time.monotonic() - start) * 1000, 1)
            want = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"]).run(None, {"image": x})[0]
            figures["match"], figures["max_abs_diff"] = answers_match(got, want)
        finally:
            if started:
                launcher.stop()
            broker.stop()
    return figures


def _device(device_python: list[str], args: list[str], timeout_s: float) -> str:
    proc = subprocess.run([*device_python, *args], capture_output=True, text=True, timeout=timeout_s)
    if proc.returncode != 0:
        raise SystemExit(f"device: {shlex.join(args)} exited {proc.returncode}: {proc.stderr.strip()[-2000:]}")
    return proc.stdout


def _edgectl(env: dict[str, str], *args: str) -> None:
    proc = subprocess.run([sys.executable, "-m", "edgectl.cli.main", *args], capture_output=True, text=True,
                          env={**os.environ, **env}, timeout=1800)
    if proc.returncode != 0:
        raise SystemExit(f"edgectl {' '.join(args)} exited {proc.returncode}: {proc.stdout[-1000:]} {proc.stderr[-1000:]}")


def _get(port: int, path: str) -> Any:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as answer:
            return json.loads(answer.read() or b"{}")
    except OSError:
        return None


def _infer(port: int, x: np.ndarray) -> np.ndarray:
    body = {"inputs": [{"name": "image", "shape": list(x.shape), "datatype": "FP32", "data": x.ravel().tolist()}]}
    request = urllib.request.Request(f"http://127.0.0.1:{port}/v2/models/classifier/infer", json.dumps(body).encode(),
                                     {"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=300) as answer:
        out = json.loads(answer.read())["outputs"][0]
    return np.asarray(out["data"], np.float32).reshape(out["shape"])


def _wait(ready: Callable[[], bool], timeout_s: float, what: str, launcher: Launcher) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not launcher.alive():
            raise SystemExit(f"the agent stopped before {what} answered")
        if ready():
            return
        time.sleep(1)
    raise SystemExit(f"{what} did not answer within {timeout_s:.0f} s")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--device-python", required=True, help="command that runs the device's python (shell words)")
    parser.add_argument("--exchange", required=True, help="HOST_DIR:DEVICE_DIR, one directory as both sides name it")
    parser.add_argument("--service", help="start the agent by this unit (systemctl on PATH), config in /etc/edge-agent")
    parser.add_argument("--timeout", type=float, default=1800, help="seconds for each step (emulation is slow)")
    args = parser.parse_args(argv)
    exchange = Exchange.parse(args.exchange)
    exchange.host.mkdir(parents=True, exist_ok=True)
    python = shlex.split(args.device_python)
    launcher = ServiceLauncher(args.service) if args.service else ProcessLauncher(python, exchange)
    figures = trial(python, exchange, launcher, args.timeout, lambda step: print(f"... {step}", file=sys.stderr))
    print(json.dumps(figures))
    return 0 if figures["match"] else 5


if __name__ == "__main__":
    sys.exit(main())

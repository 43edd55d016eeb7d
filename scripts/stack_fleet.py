"""The parts of the stack that are edgectl's own: the operator's home, the controller replicas, the artifact
origin, Prometheus on the shipped scrape config, enrolled agents and simulated devices.

Each part is started the way docs/fleet.md and docs/agent-install.md tell an operator to: ``edgectl keys
init``, ``edgectl pki init``, ``edgectl broker config``, ``edgectl device enroll``, ``edgectl users add``,
``edgectl tokens create NAME > file``, ``edgectl controller run --http``, ``edgectl artifacts serve``,
``edge-agent run --config``, ``edgectl sim``. Every edgectl command runs this checkout's code.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from stack_state import Proc, StackState, free_port, spawn, wait_port

REPO = Path(__file__).resolve().parents[1]
SHIPPED_SCRAPE = REPO / "configs" / "prometheus" / "edgectl.yml"

__all__ = [
    "SHIPPED_SCRAPE",
    "Operator",
    "prometheus_config",
    "start_agent",
    "start_artifacts",
    "start_controller",
    "start_prometheus",
    "start_sims",
]


def checkout_env(extra: Mapping[str, str]) -> dict[str, str]:
    """This process's environment with this checkout first on PYTHONPATH (as tests.checkout.checkout_env)."""
    import os

    env = {**os.environ, **extra, "PYTHONUNBUFFERED": "1"}
    env["PYTHONPATH"] = ":".join([str(REPO), *[p for p in env.get("PYTHONPATH", "").split(":") if p]])
    return env


@dataclass(frozen=True)
class Operator:
    """The operator's EDGECTL_HOME and edgectl.yaml: keys, the fleet PKI, the store, the brokers."""

    home: Path
    config: Path

    def env(self, home: Path | None = None) -> dict[str, str]:
        return checkout_env({"EDGECTL_HOME": str(home or self.home), "EDGECTL_CONFIG": str(self.config)})

    def edgectl(self, *args: str, home: Path | None = None, config: Path | None = None) -> str:
        """Run an edgectl command as the operator; its stdout (RuntimeError with its one-line error otherwise)."""
        env = self.env(home)
        if config is not None:
            env["EDGECTL_CONFIG"] = str(config)
        done = subprocess.run([sys.executable, "-m", "edgectl.cli.main", *args], env=env, capture_output=True, text=True,
                              timeout=300, cwd=home or self.home)
        if done.returncode != 0:
            raise RuntimeError(f"edgectl {' '.join(args[:3])} exited {done.returncode}: {done.stderr.strip()[-500:]}")
        return done.stdout

    def write_config(self, store: str, brokers: list[str], timeout_s: float) -> None:
        pki = self.home / "pki"
        write_yaml(self.config, {
            "brokers": brokers,
            "tls": {"ca": str(pki / "ca.pem"), "cert": str(pki / "controller.pem"), "key": str(pki / "controller.key")},
            "controller": {"store": store},
            "deploy": {"timeout_s": timeout_s},
        })

    def replica_home(self, target: Path) -> Path:
        """A controller replica's home, as on a host of its own: the signing keys every replica needs, nothing else."""
        target.mkdir(parents=True, exist_ok=True)
        if not (target / "keys").exists():
            shutil.copytree(self.home / "keys", target / "keys")
        return target


def write_yaml(path: Path, data: Mapping[str, Any], mode: int = 0o644) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(dict(data), sort_keys=False))
    path.chmod(mode)


def start_controller(state: StackState, operator: Operator, name: str, logs: Path) -> Proc:
    home = operator.replica_home(Path(state.dir) / name)
    port = free_port()
    proc = spawn(name, [sys.executable, "-m", "edgectl.cli.main", "controller", "run", "--http", f"127.0.0.1:{port}"],
                 logs, operator.env(home), cwd=home, port=port)
    state.api_urls.append(f"http://127.0.0.1:{port}")
    return state.add(proc)


def start_artifacts(state: StackState, operator: Operator, logs: Path) -> Proc:
    folder = Path(state.dir) / "artifacts"
    folder.mkdir(parents=True, exist_ok=True)
    port = free_port()
    proc = spawn("artifacts", [sys.executable, "-m", "edgectl.cli.main", "artifacts", "serve", str(folder), "--host",
                               "127.0.0.1", "--port", str(port)], logs, operator.env(), cwd=operator.home, port=port)
    state.artifact_url, state.artifact_dir = f"http://127.0.0.1:{port}", str(folder)
    return state.add(proc)


def prometheus_config(scrape_s: float, token: Path, targets: list[str]) -> dict[str, Any]:
    """The shipped scrape config with this stack's interval, token file and targets, and its alert rules."""
    config: dict[str, Any] = yaml.safe_load(SHIPPED_SCRAPE.read_text())
    config["global"]["scrape_interval"] = f"{scrape_s:g}s"
    # rule_files are relative to the config's folder: the copy lives elsewhere, so name the shipped files.
    config["rule_files"] = [str(SHIPPED_SCRAPE.parent / name) for name in config.get("rule_files", [])]
    job = config["scrape_configs"][0]
    job["authorization"]["credentials_file"] = str(token)
    job["static_configs"][0]["targets"] = targets
    return config


def start_prometheus(state: StackState, operator: Operator, logs: Path, scrape_s: float) -> Proc:
    """Prometheus on the shipped scrape config: its job as shipped, with the replicas as targets and the token file."""
    folder = Path(state.dir) / "prometheus"
    folder.mkdir(parents=True, exist_ok=True)
    token = folder / "edgectl.token"
    operator.edgectl("users", "add", "prometheus", "--role", "viewer")
    # The command configs/prometheus/edgectl.yml gives, as a shell runs it: only the token reaches the file.
    with token.open("w") as out:
        subprocess.run([sys.executable, "-m", "edgectl.cli.main", "tokens", "create", "prometheus", "--name", "prometheus"],
                       env=operator.env(), stdout=out, stderr=subprocess.DEVNULL, check=True, timeout=120)
    token.chmod(0o600)
    targets = [url.removeprefix("http://") for url in state.api_urls]
    write_yaml(folder / "prometheus.yml", prometheus_config(scrape_s, token, targets))
    port = free_port()
    binary = shutil.which("prometheus") or "/usr/bin/prometheus"
    if not Path(binary).exists():
        raise RuntimeError("prometheus is not installed: apt-get install prometheus (./scripts/test does as root)")
    proc = spawn("prometheus", [binary, f"--config.file={folder / 'prometheus.yml'}", f"--storage.tsdb.path={folder / 'data'}",
                                f"--web.listen-address=127.0.0.1:{port}"], logs, port=port)
    state.prometheus_url = f"http://127.0.0.1:{port}"
    return state.add(proc)


def enroll(operator: Operator, device_id: str, out: Path, broker_url: str, tags: str) -> Path:
    """``edgectl device enroll`` with the fleet's package and controller keys: the agent's config bundle."""
    keys = out.parent / "trusted"
    keys.mkdir(parents=True, exist_ok=True)
    for role in ("package", "controller"):
        if not (keys / f"{role}.pub").exists():
            operator.edgectl("keys", "export", role, "-o", str(keys / f"{role}.pub"))
    operator.edgectl("device", "enroll", device_id, "--tags", tags, "--broker-url", broker_url, "--out", str(out),
                     "--trust-package-key", str(keys / "package.pub"), "--trust-controller-key", str(keys / "controller.pub"))
    return out / "agent.yaml"


def start_agent(state: StackState, operator: Operator, device_id: str, logs: Path, telemetry_s: float) -> Proc:
    """A real edge-agent on its enrolled bundle, with every broker of the cluster and a target profile."""
    bundle = Path(state.dir) / "agents" / device_id
    config = enroll(operator, device_id, bundle, state.broker_urls[0], "stack=agents")
    data = yaml.safe_load(config.read_text())
    port = free_port()
    data.update({"brokers": state.broker_urls, "target": "cpu-x86", "state_dir": str(bundle / "state"),
                 "telemetry_interval_s": telemetry_s, "inference": {"port": port}, "deploy": {"selection_budget_s": 1.0}})
    write_yaml(config, data, 0o600)
    proc = spawn(f"agent-{device_id}", [sys.executable, "-m", "agent.cli.main", "run", "--config", str(config)], logs,
                 checkout_env({}), cwd=bundle, port=port)
    state.agents.append(device_id)
    return state.add(proc)


def start_sims(state: StackState, operator: Operator, count: int, logs: Path, telemetry_s: float) -> Proc:
    """``edgectl sim`` with one certificate for all its devices (the ACL's sim-fleet identity) and the fleet's keys."""
    from stack_brokers import SIM_IDENTITY

    folder = Path(state.dir) / "sim"
    identity = folder / "identity"
    enroll(operator, SIM_IDENTITY, identity, state.broker_urls[0], "stack=sim")
    home = operator.replica_home(folder / "home")
    config = folder / "edgectl.yaml"
    tls = {"ca": str(identity / "ca.pem"), "cert": str(identity / "device.pem"), "key": str(identity / "device.key")}
    write_yaml(config, {"brokers": state.broker_urls, "tls": tls})
    argv = [sys.executable, "-m", "edgectl.cli.main", "sim", "--profiles", f"cpu-x86:{count}", "--prefix", "stack",
            "--tag", "stack=sim", "--state-dir", str(folder / "state"), "--telemetry-s", f"{telemetry_s:g}"]
    env = operator.env(home)
    env["EDGECTL_CONFIG"] = str(config)
    proc = spawn("sim", argv, logs, env, cwd=home)
    state.sims = [f"stack-cpu-x86-{i:03d}" for i in range(count)]
    return state.add(proc)


def create_admin_token(operator: Operator) -> str:
    operator.edgectl("users", "add", "admin", "--role", "admin")
    return str(json.loads(operator.edgectl("tokens", "create", "admin", "--name", "stack", "--json"))["token"])


def wait_api(proc: Proc) -> None:
    wait_port(proc.port, 120, proc)

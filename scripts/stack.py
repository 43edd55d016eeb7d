"""``./scripts/stack up|down|status|env``: on one machine, the production deployment docs/fleet.md describes.

``up`` brings up, each as its own process: PostgreSQL (``initdb``/``pg_ctl`` on a free port, never the
system server), a 3-node NATS cluster serving MQTT over TLS (or ``--broker mosquitto``: one Mosquitto),
the fleet PKI (CA, broker, controller and device certificates; topic ACLs per identity), two
``edgectl controller run --http`` replicas on the one store, the HTTP artifact origin, Prometheus on the
shipped scrape config, enrolled ``edge-agent`` processes and ``edgectl sim`` devices; it waits until the
replicas answer, every device is online in the store and Prometheus scrapes both replicas. ``status``
says what runs; ``env`` prints the exports that make ``edgectl`` this stack's operator; ``down`` stops
everything (``--purge`` also removes the directory). What runs is recorded in DIR/stack.json.
"""

from __future__ import annotations

import argparse
import json
import shlex
import shutil
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

from stack_brokers import SIM_IDENTITY, BrokerFiles, allow_simulator, start_mosquitto, start_nats
from stack_fleet import (
    REPO,
    Operator,
    create_admin_token,
    start_agent,
    start_artifacts,
    start_controller,
    start_prometheus,
    start_sims,
    wait_api,
)
from stack_state import StackState, free_port, stop_all

sys.path.insert(0, str(REPO))  # tests.postgres: the one way this project runs a PostgreSQL of its own

DEFAULT_DIR = Path(tempfile.gettempdir()) / "edgectl-stack"
STOP_ORDER = ("sim", "agent-", "prometheus", "artifacts", "controller-", "nats-", "mosquitto")


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="./scripts/stack", description=__doc__.split("\n\n")[0])
    parser.add_argument("command", choices=("up", "down", "status", "env"))
    parser.add_argument("--dir", type=Path, default=DEFAULT_DIR, help=f"the stack's directory (default {DEFAULT_DIR})")
    parser.add_argument("--broker", choices=("nats", "mosquitto"), default="nats", help="the MQTT broker (default nats)")
    parser.add_argument("--agents", type=int, default=2, help="real edge-agent processes (default 2)")
    parser.add_argument("--sims", type=int, default=12, help="simulated devices (default 12)")
    parser.add_argument("--scrape-s", type=float, default=15.0, help="Prometheus scrape interval (default 15, as shipped)")
    parser.add_argument("--telemetry-s", type=float, default=5.0, help="devices' telemetry interval (default 5)")
    parser.add_argument("--timeout-s", type=float, default=600.0, help="deploy.timeout_s: a wave's timeout (default 600)")
    parser.add_argument("--json", action="store_true", help="print the stack's record as JSON")
    parser.add_argument("--purge", action="store_true", help="down: also remove the directory")
    args = parser.parse_args(argv)
    directory = args.dir.resolve()
    try:
        if args.command == "up":
            state = up(directory, args)
            print(json.dumps(_public(state)) if args.json else _summary(state))
        elif args.command == "down":
            down(directory, args.purge)
        elif args.command == "status":
            report = status(directory)
            print(json.dumps(report) if args.json else "\n".join(f"{k}: {v}" for k, v in report.items()))
            return 0 if report.get("up") else 3
        else:
            state = _need(directory)
            print("\n".join(f"export {k}={shlex.quote(v)}" for k, v in state.env().items()))
    except RuntimeError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


def up(directory: Path, args: argparse.Namespace) -> StackState:
    existing = StackState.load(directory)
    if existing is not None and any(p.alive() for p in existing.procs.values()):
        raise RuntimeError(f"a stack already runs from {directory}: ./scripts/stack down --dir {directory} first")
    if directory.exists():
        shutil.rmtree(directory)
    directory.mkdir(parents=True, mode=0o755)
    logs = directory / "logs"
    operator = Operator(directory / "home", directory / "home" / "edgectl.yaml")
    operator.home.mkdir(parents=True)
    operator.edgectl("keys", "init")
    operator.edgectl("pki", "init")
    state = StackState(str(directory), args.broker, [], "", str(operator.home), str(operator.config))
    state.save()
    try:
        _bring_up(state, operator, logs, args)
    except BaseException:
        down(directory, purge=False)
        raise
    return state


def _bring_up(state: StackState, operator: Operator, logs: Path, args: argparse.Namespace) -> None:
    directory = Path(state.dir)
    agents = [f"stack-agent-{i + 1}" for i in range(args.agents)]
    files = BrokerFiles(directory / "broker")
    mosquitto_port = free_port()
    operator.edgectl("broker", "config", "--out", str(files.dir), "--port", str(mosquitto_port), "--host", "127.0.0.1",
                     "--host", "localhost", "--bind", "127.0.0.1")
    _postgres(state)
    client = _tls(operator)
    if args.broker == "nats":
        for proc in start_nats(directory / "nats", logs, files, agents, client):
            state.add(proc)
        state.broker_urls = [f"mqtts://127.0.0.1:{state.procs[f'nats-{i}'].port}" for i in (1, 2, 3)]
    else:
        allow_simulator(files.dir / "acl")
        state.add(start_mosquitto(files, logs, mosquitto_port, client))
        state.broker_urls = [f"mqtts://127.0.0.1:{mosquitto_port}"]
    operator.write_config(state.store_url, state.broker_urls, args.timeout_s)
    state.admin_token = create_admin_token(operator)
    state.save()
    for name in ("controller-1", "controller-2"):
        start_controller(state, operator, name, logs)
    start_artifacts(state, operator, logs)
    for name in ("controller-1", "controller-2"):
        wait_api(state.procs[name])
    start_prometheus(state, operator, logs, args.scrape_s)
    for device_id in agents:
        start_agent(state, operator, device_id, logs, args.telemetry_s)
    if args.sims:
        start_sims(state, operator, args.sims, logs, args.telemetry_s)
    state.save()
    _wait_ready(state)


def _postgres(state: StackState) -> None:
    """A PostgreSQL cluster of the stack's own (tests.postgres: initdb in a directory under /tmp, a free port)."""
    import os
    import pwd

    from tests.postgres import PostgresCluster, find_bin

    bin_dir = find_bin()
    if bin_dir is None:
        raise RuntimeError("PostgreSQL is not installed: apt-get install postgresql (./scripts/test does as root)")
    root = Path(tempfile.mkdtemp(prefix="edgectl-stack-pg-"))  # under /tmp: the postgres user must reach it
    run_as: list[str] = []
    if os.geteuid() == 0:  # initdb refuses root
        user = pwd.getpwnam("postgres")
        os.chown(root, user.pw_uid, user.pw_gid)
        run_as = ["runuser", "-u", "postgres", "--"]
    state.pg_root, state.pg_bin, state.pg_run_as = str(root), str(bin_dir), run_as
    state.save()
    cluster = PostgresCluster(bin_dir, root, free_port(), run_as).start()
    state.store_url = cluster.create_database()
    state.save()


def _tls(operator: Operator) -> Any:
    from edgecore.tls import tls_context

    pki = operator.home / "pki"
    return tls_context(pki / "ca.pem", pki / "controller.pem", pki / "controller.key")


def _wait_ready(state: StackState, timeout: float = 180.0) -> None:
    """Both replicas answer, every device is online in the store, Prometheus scrapes both replicas."""
    deadline = time.monotonic() + timeout
    devices = len(state.agents) + len(state.sims)
    while True:
        report = status(Path(state.dir))
        if report["up"] and report["devices_online"] == devices and report["prometheus_targets_up"] == len(state.api_urls):
            return
        dead = [name for name, alive in report["processes"].items() if not alive]
        if dead or time.monotonic() > deadline:
            raise RuntimeError(f"the stack did not come up ({'exited: ' + ', '.join(dead) if dead else 'timed out'}): "
                               f"{report}; logs in {Path(state.dir) / 'logs'}")
        time.sleep(1.0)


def status(directory: Path) -> dict[str, Any]:
    state = _need(directory)
    alive = {name: proc.alive() for name, proc in state.procs.items()}
    online = _get(state.api_urls[0] + "/api/v1/fleet/summary", state.admin_token) if state.api_urls else None
    targets = _get(state.prometheus_url + "/api/v1/targets", None) if state.prometheus_url else None
    up_targets = sum(t.get("health") == "up" for t in (targets or {}).get("data", {}).get("activeTargets", []))
    return {"up": bool(alive) and all(alive.values()) and online is not None, "dir": state.dir, "broker": state.broker,
            "broker_urls": state.broker_urls, "api_urls": state.api_urls, "prometheus": state.prometheus_url,
            "devices_online": (online or {}).get("by_status", {}).get("online", 0), "prometheus_targets_up": up_targets,
            "processes": alive}


def _get(url: str, token: str | None) -> dict[str, Any] | None:
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"} if token else {})
    try:
        with urllib.request.urlopen(request, timeout=5) as response:
            data: dict[str, Any] = json.loads(response.read())
            return data
    except (OSError, ValueError):
        return None


def down(directory: Path, purge: bool) -> None:
    state = StackState.load(directory)
    if state is not None:
        for prefix in STOP_ORDER:  # devices first, brokers last; the processes of one kind together
            stop_all([p for name, p in state.procs.items() if name.startswith(prefix)])
        if state.pg_root and Path(state.pg_root).exists():
            from tests.postgres import PostgresCluster

            PostgresCluster(Path(state.pg_bin), Path(state.pg_root), 0, state.pg_run_as).stop()  # removes its directory
    if purge and directory.exists():
        shutil.rmtree(directory)


def _need(directory: Path) -> StackState:
    state = StackState.load(directory)
    if state is None:
        raise RuntimeError(f"no stack in {directory}: ./scripts/stack up --dir {directory}")
    return state


def _public(state: StackState) -> dict[str, Any]:
    return {"dir": state.dir, "broker": state.broker, "broker_urls": state.broker_urls, "store": state.store_url,
            "api_urls": state.api_urls, "artifacts": state.artifact_url, "artifacts_dir": state.artifact_dir,
            "prometheus": state.prometheus_url, "agents": state.agents, "sims": state.sims, "env": state.env(),
            "admin_token": state.admin_token}


def _summary(state: StackState) -> str:
    lines = [f"stack up in {state.dir} ({state.broker}: {', '.join(state.broker_urls)})",
             f"store        {state.store_url}",
             *(f"controller   {url}/console/  (API {url}/api/v1)" for url in state.api_urls),
             f"artifacts    {state.artifact_url}",
             f"prometheus   {state.prometheus_url}",
             f"devices      {len(state.agents)} edge-agent + {len(state.sims)} simulated ({SIM_IDENTITY} identity)",
             f"admin token  {state.admin_token}",
             f"operator     eval \"$(./scripts/stack env --dir {state.dir})\"   then edgectl ...",
             f"logs         {Path(state.dir) / 'logs'}",
             f"stop         ./scripts/stack down --dir {state.dir}"]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

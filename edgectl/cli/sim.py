"""``edgectl sim``: a simulated fleet of light agents on this machine, for trying rollouts."""

from __future__ import annotations

import json
import signal
import threading
import time
from pathlib import Path

import typer

from edgecore.delivery.http_fetch import HttpSettings
from edgecore.errors import UserError
from edgecore.tls import tls_context
from edgectl.cli.app import app, options
from edgectl.cli.output import console, print_json, print_table
from edgectl.config import load_edgectl_config
from edgectl.connection import checked_broker
from edgectl.home import edgectl_home
from edgectl.keys import Keyring
from edgectl.sim import BASE_LATENCY_MS, SimAgent, SimFleet

__all__ = ["MAX_PER_PROCESS", "parse_factors", "parse_profiles"]

MAX_PER_PROCESS = 300  # each light agent holds 3 file descriptors (socket and paho's wake-up pair)


def parse_profiles(text: str | None, agents: int | None) -> list[tuple[str, int]]:
    """``jetson-orin:10,nnapi:20`` -> [(profile, count)]; counts must add up to ``agents`` if given."""
    if not text:
        if agents is None:
            raise UserError("give --agents N, --profiles PROFILE:COUNT,..., or both")
        return _within_limit([("cpu-x86", agents)])
    mix = []
    for part in text.split(","):
        name, sep, count = part.strip().partition(":")
        if not sep or not count.strip().isdigit() or int(count) < 1:
            raise UserError(f"--profiles: {part.strip()!r} is not PROFILE:COUNT with COUNT >= 1")
        if name.strip() not in BASE_LATENCY_MS:
            raise UserError(f"--profiles: unknown profile {name.strip()!r} (simulated: {', '.join(sorted(BASE_LATENCY_MS))})")
        mix.append((name.strip(), int(count)))
    total = sum(n for _, n in mix)
    if agents is not None and agents != total:
        raise UserError(f"--agents {agents} but --profiles adds up to {total}")
    return _within_limit(mix)


def _within_limit(mix: list[tuple[str, int]]) -> list[tuple[str, int]]:
    total = sum(n for _, n in mix)
    if total > MAX_PER_PROCESS:
        raise UserError(f"{total} agents: one process runs at most {MAX_PER_PROCESS} (paho's select() loop stops at file"
                        " descriptor 1024); start several `edgectl sim` with different --prefix")
    return mix


def parse_factors(values: list[str], what: str) -> dict[str, float]:
    """``2.0`` (every model) or ``NAME@VERSION=2.0`` -> {"*" or "NAME@VERSION": factor}."""
    factors = {}
    for value in values:
        key, _sep, number = value.rpartition("=") if "=" in value else ("*", "=", value)
        try:
            factor = float(number)
        except ValueError:
            raise UserError(f"{what}: {value!r} is not FACTOR or NAME@VERSION=FACTOR") from None
        if factor <= 0 or (key != "*" and "@" not in key):
            raise UserError(f"{what}: {value!r} is not FACTOR or NAME@VERSION=FACTOR (FACTOR > 0)")
        factors[key] = factor
    return factors


def _parse_tags(values: list[str]) -> dict[str, str]:
    tags = {}
    for value in values:
        key, sep, tag = value.partition("=")
        if not sep or not key.strip() or not tag.strip():
            raise UserError(f"--tag: {value!r} is not KEY=VALUE")
        tags[key.strip()] = tag.strip()
    return tags


@app.command("sim")
def sim(
    ctx: typer.Context,
    agents: int | None = typer.Option(
        None, "--agents", "-n", min=1, help="Number of simulated agents (default: the sum of --profiles)."),
    profiles: str | None = typer.Option(
        None, "--profiles", help="Target profile mix, e.g. jetson-orin:10,nnapi:20,cpu-x86:20 (default: all cpu-x86)."),
    latency_factor: list[str] = typer.Option(
        [], "--latency-factor",
        help="Make models slower on these agents: FACTOR for every model, or NAME@VERSION=FACTOR. Repeatable."),
    agreement: list[str] = typer.Option(
        [], "--agreement", help="Shadow-run agreement the agents report for NAME@VERSION=FRACTION (default 1.0). Repeatable."),
    fallback: int = typer.Option(
        0, "--fallback", min=0,
        help="This many agents (the last ones) end up on the CPU instead of their profile's accelerator."),
    tag: list[str] = typer.Option([], "--tag", help="KEY=VALUE tag every agent announces (for --fleet selectors). Repeatable."),
    prefix: str = typer.Option("sim", "--prefix", help="Device ids are PREFIX-PROFILE-NNN."),
    state_dir: Path | None = typer.Option(
        None, "--state-dir", help="Where each agent keeps its state (default $EDGECTL_HOME/sim); a restart keeps active models."),
    telemetry_s: float = typer.Option(1.0, "--telemetry-s", min=0.05, help="Seconds between telemetry reports of each agent."),
    duration: float | None = typer.Option(
        None, "--duration", min=0.1, help="Stop after this many seconds (default: run until Ctrl-C/SIGTERM)."),
    http_ca: Path | None = typer.Option(
        None, "--http-ca", exists=True, dir_okay=False,
        help="CA bundle for https:// artifact URLs (the agent's deploy.http_ca; default: the system's trust store)."),
    http_rate: int | None = typer.Option(
        None, "--http-max-bytes-per-s", min=1, help="Cap on each agent's HTTP download rate (deploy.http_max_bytes_per_s)."),
    json_out: bool = typer.Option(
        False, "--json", help="Print the agents as JSON instead of a table (and on exit: telemetry reports sent per second)."),
) -> None:
    """Run N light simulated agents against the broker until Ctrl-C, so rollouts can be tried without hardware.

    Each agent has its own MQTT connection, device id, state directory and target profile and runs
    the real protocol, signature checks, chunked download with hash checks (by HTTP(S) Range when
    the desired state names model.urls, MQTT chunks for the rest) and payload extraction;
    the hardware, model loading and inference latency are simulated (see docs/fleet.md). They trust
    the package and controller keys of this workstation's keyring. 200 agents run comfortably on 2 cores.
    """
    opts = options(ctx)
    mix = parse_profiles(profiles, agents)
    factors = parse_factors(latency_factor, "--latency-factor")
    agreements = parse_factors(agreement, "--agreement")
    tags = _parse_tags(tag)
    config = load_edgectl_config(opts.config)
    url = checked_broker(opts.broker, config)  # after the arguments: errors stay one line
    ring = Keyring()
    tls = tls_context(config.tls.ca, config.tls.cert, config.tls.key) if config.tls.ca else None
    fleet = SimFleet(url, ring.trusted("package"), ring.trusted("controller"), telemetry_s=telemetry_s,
                     http=HttpSettings(max_bytes_per_s=http_rate, ca_file=http_ca), tls=tls)
    root = state_dir or edgectl_home() / "sim"
    started = _start(fleet, mix, root, prefix, factors, agreements, tags, fallback)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    connected = _wait_connected(started, 30)
    rows = [{"device_id": a.device_id, "profile": a.profile, "backend": a.backend, "state_dir": str(a.state_dir)}
            for a in started]
    if json_out:
        print_json({"broker": url, "connected": connected, "agents": rows})
    else:
        counts = ", ".join(f"{name}: {n}" for name, n in mix)
        print_table(f"{len(started)} simulated agents ({counts}) on {url}", ["device", "profile", "backend"],
                    [(r["device_id"], r["profile"], r["backend"]) for r in rows[:20]])
        if len(rows) > 20:
            console.print(f"... and {len(rows) - 20} more")
        console.print(f"{connected}/{len(started)} connected; Ctrl-C stops them")
    try:
        stop.wait(duration)
    except KeyboardInterrupt:
        pass
    finally:
        fleet.stop()
        if json_out:  # one line, for benchmarks: how many reports really went out, per wall-clock second
            print(json.dumps({"telemetry_sent": {str(k): v for k, v in sorted(fleet.telemetry_sent.items())}}), flush=True)


def _start(fleet: SimFleet, mix: list[tuple[str, int]], root: Path, prefix: str, factors: dict[str, float],
           agreements: dict[str, float], tags: dict[str, str], fallback: int) -> list[SimAgent]:
    total = sum(n for _, n in mix)
    started: list[SimAgent] = []
    for profile, count in mix:
        for i in range(count):
            device_id = f"{prefix}-{profile}-{i:03d}"
            agent = SimAgent(device_id, profile, root / device_id, latency_factor=dict(factors), agreement=dict(agreements),
                             tags=dict(tags), fallback=len(started) >= total - fallback)
            started.append(fleet.start(agent))
    return started


def _wait_connected(agents: list[SimAgent], timeout: float) -> int:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        up = sum(1 for a in agents if a.transport is not None and a.transport.connected)
        if up == len(agents):
            return up
        time.sleep(0.1)
    return sum(1 for a in agents if a.transport is not None and a.transport.connected)

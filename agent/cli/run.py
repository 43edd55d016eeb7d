"""``edge-agent run``: the daemon."""

from __future__ import annotations

import json
import logging
import signal
import sys
import time
from pathlib import Path
from typing import Any

import typer

from agent.cli.app import app
from agent.config import load_agent_config
from agent.deploy.machine import State
from edgecore.settings import parse_override

__all__ = ["run"]


class _JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        return json.dumps({
            "ts": record.created, "level": record.levelname, "logger": record.name, "message": record.getMessage(),
        })


def _setup_logging(level: str, as_json: bool) -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(_JsonFormatter() if as_json else logging.Formatter(
        "%(asctime)s %(levelname)s %(name)s: %(message)s"))
    logging.basicConfig(level=level.upper(), handlers=[handler], force=True)
    logging.getLogger("paho").setLevel(logging.WARNING)


def _pause_hook(state_name: str | None, state_dir: Path) -> Any:
    """Test seam: stop in a state (after it is saved) so a test can kill the agent there."""
    if not state_name:
        return None
    target = State(state_name)

    def pause(state: State) -> None:
        if state is target:  # until the test deletes the marker (or kills the agent)
            marker = state_dir / f"paused-in-{state.value}"
            marker.touch()
            deadline = time.monotonic() + 3600
            while marker.exists() and time.monotonic() < deadline:
                time.sleep(0.05)

    return pause


@app.command()
def run(
    config: Path | None = typer.Option(
        None, "--config", "-c", envvar="EDGE_AGENT_CONFIG", help="Agent YAML config (see configs/agent.yaml)."
    ),
    device_id: str | None = typer.Option(None, "--device-id", help="Overrides device_id."),
    broker: str | None = typer.Option(None, "--broker", help="Overrides broker, e.g. mqtts://broker:8883."),
    state_dir: Path | None = typer.Option(None, "--state-dir", help="Overrides state_dir."),
    http_port: int | None = typer.Option(None, "--http-port", help="Overrides inference.port (0: any free port)."),
    set_: list[str] = typer.Option([], "--set", help="Override any key: --set deploy.health_runs=50 (repeatable)."),
    pause_in_state: str | None = typer.Option(
        None, "--pause-in-state", hidden=True,
        help="Test hook: stop in this update state after saving it.",
    ),
) -> None:
    """Run the agent until SIGTERM or Ctrl-C. Every config key is also EDGE_AGENT_<KEY> (nested: A__B)."""
    overrides = dict(parse_override(s) for s in set_)
    for key, value in (("device_id", device_id), ("broker", broker), ("state_dir", state_dir), ("inference.port", http_port)):
        if value is not None:
            overrides[key] = str(value)
    cfg = load_agent_config(config, overrides)
    _setup_logging(cfg.log_level, cfg.log_json)
    from agent.daemon import Agent  # heavy imports (onnxruntime, openvino) only when running

    agent = Agent(cfg, pause_in=_pause_hook(pause_in_state, cfg.state_dir))
    signal.signal(signal.SIGTERM, lambda *_: agent.stop())
    signal.signal(signal.SIGINT, lambda *_: agent.stop())
    agent.run()

"""``edgectl device config set|show``: a device's configuration on the controller store (docs/fleet.md, Device configuration).

Only arguments and printing live here; what the commands do is :mod:`edgectl.fleet.device_config`.
"""

from __future__ import annotations

import json
from typing import Any

import typer

from edgecore.errors import UserError
from edgecore.protocol.device_config import CONFIG_KEYS
from edgectl.cli.access import _actor
from edgectl.cli.app import options
from edgectl.cli.output import console, print_json
from edgectl.cli.security import device_app
from edgectl.config import load_edgectl_config
from edgectl.controller.store import Store
from edgectl.fleet import open_store
from edgectl.fleet.device_config import device_config_view, set_device_config

__all__ = ["SETTINGS", "TAGS", "WINDOWS", "config_app", "config_settings"]

config_app = typer.Typer(help="A device's configuration: signed, versioned, applied by its agent over agent.yaml.",
                         no_args_is_help=True)
device_app.add_typer(config_app, name="config")

DEVICE = typer.Argument(..., metavar="ID", help="Device id (see `edgectl devices`).")
JSON = typer.Option(False, "--json", help="Print JSON.")
# The settings of a configuration, as `device config set` and `group config` take them (config_settings reads them).
SETTINGS = typer.Option([], "--set", "-s", help=f"KEY=VALUE (repeatable); keys: {', '.join(CONFIG_KEYS)}.")
TAGS = typer.Option([], "--tag", "-t", help="A tag KEY=VALUE (repeatable), merged over agent.yaml's.")
WINDOWS = typer.Option([], "--window", "-w", help="The device's own maintenance window, DAYS HH:MM-HH:MM in its local "
                       "time (repeatable): it installs no update outside them.")


def _store(ctx: typer.Context) -> Store:
    return open_store(load_edgectl_config(options(ctx).config))


def config_settings(pairs: list[str], tags: list[str], windows: list[str]) -> dict[str, Any]:
    """``KEY=VALUE`` (VALUE read as JSON when it is JSON, else as text), ``--tag K=V`` and ``--window W`` as a settings
    object."""
    settings: dict[str, Any] = {}
    for i, pair in enumerate(pairs):
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise UserError(f"--set[{i}]: {pair[:60]!r} is not KEY=VALUE (keys: {', '.join(CONFIG_KEYS)})")
        try:
            settings[key.strip()] = json.loads(value)
        except ValueError:
            settings[key.strip()] = value
    for i, tag in enumerate(tags):
        key, sep, value = tag.partition("=")
        if not sep:
            raise UserError(f"--tag[{i}]: {tag[:60]!r} is not KEY=VALUE")
        settings.setdefault("tags", {})[key.strip()] = value
    if windows:
        settings["maintenance_windows"] = windows
    return settings


def _show(view: dict[str, Any]) -> None:
    desired, reported = view["desired"], view["reported"]
    said = "none (agent.yaml alone)" if desired is None else f"v{desired['version']} {json.dumps(desired['settings'])}"
    console.print(f"device {view['device_id']}: desired {said}")
    if reported is None:
        console.print("reported: nothing yet (unknown)")
    else:
        why = f": {reported['reason']}" if reported["reason"] else ""
        console.print(f"reported: v{reported['version']} {reported['status']}{why}; in force: "
                      f"{'v' + str(reported['applied_version']) if reported['applied_version'] else 'agent.yaml alone'}")
    console.print(f"sync: {view['sync']}")


@config_app.command("set")
def config_set(
    ctx: typer.Context,
    device_id: str = DEVICE,
    pairs: list[str] = SETTINGS,
    tags: list[str] = TAGS,
    windows: list[str] = WINDOWS,
    as_json: bool = JSON,
) -> None:
    """Set the device's next configuration version: keys not given go back to its agent.yaml."""
    store = _store(ctx)
    desired = set_device_config(store, device_id, config_settings(pairs, tags, windows), _actor())
    view = device_config_view(store, device_id)
    if as_json:
        print_json(view)
    else:
        console.print(f"device {device_id}: configuration v{desired.version} stored; the controller signs and sends it")


@config_app.command("show")
def config_show(ctx: typer.Context, device_id: str = DEVICE, as_json: bool = JSON) -> None:
    """The desired configuration, what the device reports of it, and whether they agree."""
    view = device_config_view(_store(ctx), device_id)
    if as_json:
        print_json(view)
    else:
        _show(view)

"""Device group commands: ``group create|list|show|add|remove|protect|delete`` on the controller store.

Only arguments and printing live here; what the commands do is :mod:`edgectl.fleet.groups`.
"""

from __future__ import annotations

from typing import Any

import typer

from edgectl.cli.access import _actor
from edgectl.cli.app import app, options
from edgectl.cli.device_config import SETTINGS, TAGS, WINDOWS, config_settings
from edgectl.cli.output import console, print_json, print_table
from edgectl.config import load_edgectl_config
from edgectl.controller.groups import DeviceGroup, GroupKind
from edgectl.controller.store import Store
from edgectl.fleet import (
    add_members,
    create_group,
    delete_group,
    group_detail,
    group_list,
    open_store,
    remove_members,
    update_group,
)
from edgectl.fleet.device_config import set_group_config

NAME = typer.Argument(..., help="Group name (see `edgectl group list`).")
DEVICES = typer.Argument(..., help="Device ids (see `edgectl devices`).")
JSON = typer.Option(False, "--json", help="Print JSON.")

group_app = typer.Typer(help="Server-side device groups that rollouts target as --fleet group:NAME.", no_args_is_help=True)
app.add_typer(group_app, name="group")


def _store(ctx: typer.Context) -> Store:
    return open_store(load_edgectl_config(options(ctx).config), must_exist=False)


WINDOW_HELP = ("A maintenance window in the device's local time, DAYS HH:MM-HH:MM: 'daily 02:00-04:00', "
               "'Mon-Fri 22:00-02:00' (crosses midnight), 'Sat,Sun 00:00-24:00' (repeatable).")


def _said(group: DeviceGroup) -> str:
    return f"{len(group.members)} member(s)" if group.kind == GroupKind.STATIC else f"query {group.query}"


def _print_group(group: DeviceGroup, verb: str, as_json: bool) -> None:
    if as_json:
        print_json(group.to_dict())
    else:
        protected = ", protected: rollouts to it wait for approval" if group.protected else ""
        windows = f", installs only {'; '.join(group.windows)} device time" if group.windows else ""
        console.print(f"group {group.name} ({group.kind}{protected}{windows}) {verb}: {_said(group)}; "
                      f"target it with --fleet {group.selector}")


@group_app.command("create")
def group_create(
    ctx: typer.Context,
    name: str = typer.Argument(..., help="Group name: 1-63 lower-case letters, digits, '.', '_' or '-'."),
    member: list[str] = typer.Option([], "--member", "-m", help="A static group's device id (repeatable)."),
    query: str | None = typer.Option(None, "--query", "-q", help="Make a dynamic group of this selector (k=v[,k=v] over "
                                     "id, target, model, version, status, agent, site or tag keys), evaluated when used."),
    description: str = typer.Option("", "--description", help="Free text."),
    protected: bool = typer.Option(False, "--protected", help="A rollout to it waits for a second operator's approval."),
    window: list[str] = typer.Option([], "--window", "-w", help=WINDOW_HELP),
    as_json: bool = JSON,
) -> None:
    """Create a static group (--member ID...) or a dynamic group (--query SELECTOR)."""
    kind = GroupKind.STATIC if query is None else GroupKind.DYNAMIC
    group = create_group(_store(ctx), name, kind.value, member, query or "", description, _actor(), protected, window)
    _print_group(group, "created", as_json)


@group_app.command("list")
def group_list_command(ctx: typer.Context, as_json: bool = JSON) -> None:
    """List groups with how many devices each resolves to now."""
    rows = group_list(_store(ctx))
    if as_json:
        print_json(rows)
        return
    print_table("device groups", ["NAME", "KIND", "DEFINITION", "DEVICES", "WINDOWS", "DESCRIPTION"], [
        (r["name"], r["kind"], r["query"] if r["kind"] == "dynamic" else f"{len(r['members'])} member(s)",
         "unknown" if r["resolved"] is None else r["resolved"], "; ".join(r["windows"]) or "any time", r["description"])
        for r in rows])


@group_app.command("show")
def group_show(ctx: typer.Context, name: str = NAME, as_json: bool = JSON) -> None:
    """One group and the devices it resolves to now."""
    detail: dict[str, Any] = group_detail(_store(ctx), name)
    if as_json:
        print_json(detail)
        return
    query = f": {detail['query']}" if detail["query"] else ""
    console.print(f"[bold]{name}[/bold] ({detail['kind']}{query}) by {detail['created_by']} {detail['description']}")
    if detail["problem"]:
        console.print(f"does not resolve now: {detail['problem']}")
    devices = detail["devices"] or []
    print_table(f"{len(devices)} device(s)", ["DEVICE", "STATUS", "TARGET", "MODEL", "VERSION", "AGENT"], [
        (d["device_id"], d["status"], d["target"], d["model"], d["version"], d["agent_version"]) for d in devices])
    if detail["missing"]:
        console.print(f"members the store no longer holds: {', '.join(detail['missing'])}")


@group_app.command("add")
def group_add(ctx: typer.Context, name: str = NAME, device_ids: list[str] = DEVICES, as_json: bool = JSON) -> None:
    """Add devices to a static group."""
    _print_group(add_members(_store(ctx), name, device_ids, _actor()), "changed", as_json)


@group_app.command("remove")
def group_remove(ctx: typer.Context, name: str = NAME, device_ids: list[str] = DEVICES, as_json: bool = JSON) -> None:
    """Take devices out of a static group."""
    _print_group(remove_members(_store(ctx), name, device_ids, _actor()), "changed", as_json)


@group_app.command("protect")
def group_protect(
    ctx: typer.Context,
    name: str = NAME,
    off: bool = typer.Option(False, "--off", help="Take the protection off."),
    as_json: bool = JSON,
) -> None:
    """Mark a group protected: a rollout to it waits for a second operator's approval (--off: no longer)."""
    group = update_group(_store(ctx), name, protected=not off, actor=_actor())
    _print_group(group, "changed", as_json)


@group_app.command("windows")
def group_windows(
    ctx: typer.Context,
    name: str = NAME,
    window: list[str] = typer.Argument(None, help=WINDOW_HELP + " None given: the group has no windows any more."),
    as_json: bool = JSON,
) -> None:
    """Set a group's maintenance windows: its devices install only inside one, in their own local time. A rollout waits
    for each device's window; a running rollout keeps the windows it was planned with."""
    group = update_group(_store(ctx), name, windows=window or [], actor=_actor())
    _print_group(group, "changed", as_json)


@group_app.command("config")
def group_config(
    ctx: typer.Context,
    name: str = NAME,
    pairs: list[str] = SETTINGS,
    tags: list[str] = TAGS,
    windows: list[str] = WINDOWS,
    as_json: bool = JSON,
) -> None:
    """Set the configuration of every device the group resolves to now: each gets its next version (keys not given
    go back to its agent.yaml); a device that joins the group later gets none."""
    stored = set_group_config(_store(ctx), name, config_settings(pairs, tags, windows), _actor())
    if as_json:
        print_json({"group": name, "devices": [{"device_id": d.device_id, "version": d.version} for d in stored]})
    else:
        console.print(f"group {name}: configuration stored for {len(stored)} device(s) "
                      f"({', '.join(f'{d.device_id} v{d.version}' for d in stored[:5])}{' …' if len(stored) > 5 else ''}); "
                      "the controller signs and sends each")


@group_app.command("delete")
def group_delete(ctx: typer.Context, name: str = NAME, as_json: bool = JSON) -> None:
    """Delete a group (refused while a running rollout was planned from it)."""
    delete_group(_store(ctx), name, _actor())
    if as_json:
        print_json({"deleted": name})
    else:
        console.print(f"group {name} deleted")

"""``edgectl device decommission|delete``, ``edgectl package list|delete`` and ``edgectl audit``: records taken out, and
the audit log filtered (docs/fleet.md, "Decommissioning devices and deleting packages")."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import typer

from edgecore.errors import UserError
from edgectl.cli.access import _actor
from edgectl.cli.app import app, options
from edgectl.cli.output import console, print_json, print_table
from edgectl.cli.security import device_app
from edgectl.config import load_edgectl_config
from edgectl.controller.queries import AuditQuery
from edgectl.controller.store import Store
from edgectl.fleet import open_store
from edgectl.fleet.audit import audit_csv, parse_time
from edgectl.fleet.lifecycle import Revocation, decommission_device, delete_device, delete_package, fleet_pki
from edgectl.pki import default_pki_dir

__all__ = ["package_app"]

package_app = typer.Typer(help="Packages uploaded to the controller (the REST API's and the console's).", no_args_is_help=True)
app.add_typer(package_app, name="package")

JSON = typer.Option(False, "--json", help="Print JSON.")


def _store(ctx: typer.Context) -> Store:
    return open_store(load_edgectl_config(options(ctx).config))


@device_app.command("decommission")
def device_decommission(
    ctx: typer.Context,
    device_id: str = typer.Argument(..., metavar="ID", help="Device id (see `edgectl devices`)."),
    directory: Path | None = typer.Option(None, "--pki", envvar="EDGECTL_PKI",
                                          help="PKI directory whose CA revokes its certificate (default: $EDGECTL_HOME/pki)."),
    as_json: bool = JSON,
) -> None:
    """Take a device out of the fleet: revoke its certificate, stop all updates to it, keep it for history."""
    done = decommission_device(_store(ctx), device_id, _actor(), fleet_pki(directory or default_pki_dir()))
    if as_json:
        print_json(done.to_dict())
        return
    console.print(f"decommissioned {device_id}: the controller clears its retained desired state and drops its reports")
    if done.certificate is Revocation.REVOKED:
        console.print(f"certificate revoked; CRL written to {', '.join(done.crl_written)}: reload (or restart) the broker")
    elif done.certificate is Revocation.NO_PKI:
        console.print("no fleet CA here: no certificate revoked (a plaintext fleet; else `edgectl device revoke` "
                      "where the CA is)")
    else:
        console.print(f"certificate: {done.certificate}")


@device_app.command("delete")
def device_delete(
    ctx: typer.Context,
    device_id: str = typer.Argument(..., metavar="ID", help="A decommissioned device's id."),
    as_json: bool = JSON,
) -> None:
    """Delete a decommissioned device's record and history (its rollout rows and audit entries stay)."""
    delete_device(_store(ctx), device_id, _actor())
    if as_json:
        print_json({"deleted": device_id})
    else:
        console.print(f"deleted {device_id}")


@package_app.command("list")
def package_list(ctx: typer.Context, as_json: bool = JSON) -> None:
    """Uploaded packages, oldest first, with the rollouts that name each."""
    store = _store(ctx)
    users: dict[str, list[str]] = {}
    for rollout in store.rollouts():
        for ref in rollout.spec.packages:
            users.setdefault(ref.variant, []).append(rollout.id)
    packages = store.packages()
    if as_json:
        print_json([{**{k: v for k, v in p.to_dict().items() if k != "path"}, "rollouts": users.get(p.ref.variant, [])}
                    for p in packages])
        return
    print_table("packages", ["VARIANT", "NAME", "VERSION", "TARGET", "UPLOADED", "BY", "ROLLOUTS"], [
        (p.ref.variant, p.ref.name, p.ref.version, p.ref.target, time.strftime("%Y-%m-%d %H:%M", time.localtime(p.uploaded)),
         p.actor, ", ".join(users.get(p.ref.variant, [])) or "-") for p in packages])


@package_app.command("delete")
def package_delete(
    ctx: typer.Context,
    variant: str = typer.Argument(..., help="The package's variant id (64 hex digits; `edgectl package list`)."),
    as_json: bool = JSON,
) -> None:
    """Delete an uploaded package and its kept file; refused while any rollout names it."""
    deleted = delete_package(_store(ctx), variant, _actor())
    if as_json:
        print_json({"deleted": variant})
    else:
        console.print(f"deleted {deleted.ref.label} ({variant[:12]})")


@app.command("audit")
def audit(
    ctx: typer.Context,
    actor: str = typer.Option("", "--actor", help="Only this actor's entries (user:alice, controller); a trailing * "
                              "matches a prefix."),
    action: str = typer.Option("", "--action", help="Only this action ('device decommissioned'); a trailing * matches a "
                               "prefix."),
    since: str | None = typer.Option(None, "--since", help="From this time: Unix seconds or ISO 8601 (UTC unless given)."),
    until: str | None = typer.Option(None, "--until", help="Before this time: Unix seconds or ISO 8601."),
    rollout: str = typer.Option("", "--rollout", help="Only entries about this rollout."),
    device: str = typer.Option("", "--device", help="Only entries about this device."),
    limit: int = typer.Option(200, "--limit", min=1, max=100_000, help="Newest entries to show (oldest first)."),
    offset: int = typer.Option(0, "--offset", min=0, help="Newest matching entries to skip (page back in time)."),
    as_json: bool = JSON,
    as_csv: bool = typer.Option(False, "--csv", help="Print CSV (cells a spreadsheet would run as formulas start with ')."),
) -> None:
    """The audit log: operator actions with their actor, controller decisions, device transitions; filtered."""
    if as_json and as_csv:
        raise UserError("--json and --csv: give one of them")
    start = None if since is None else parse_time(since, "--since")
    end = None if until is None else parse_time(until, "--until")
    if start is not None and end is not None and end <= start:
        raise UserError("--until: must be after --since")
    page = _store(ctx).audit_page(AuditQuery(actor, action, rollout, device, start, end, limit, offset))
    if as_csv:
        sys.stdout.write(audit_csv(page.entries))
    elif as_json:
        print_json({"entries": [e.to_dict() for e in page.entries], "total": page.total, "limit": limit, "offset": offset})
    else:
        print_table(f"audit ({len(page.entries)} of {page.total})", ["TIME", "ACTOR", "ACTION", "ROLLOUT", "DEVICE", "DETAIL"], [
            (time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(e.ts)), e.actor, e.action, e.rollout_id, e.device_id,
             e.detail[:80]) for e in page.entries])

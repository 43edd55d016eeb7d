"""``edgectl webhook add|list|remove|deliveries|redeliver``: rollout and device events POSTed to other systems.

Webhooks live in the controller store (as users and tokens do); `edgectl controller run` sends
the deliveries. Only arguments and printing live here: :mod:`edgectl.fleet.webhooks` does the work.
"""

from __future__ import annotations

import time
from pathlib import Path

import typer

from edgecore.errors import UserError
from edgectl.cli.access import _actor
from edgectl.cli.app import app, options
from edgectl.cli.output import console, print_json, print_table
from edgectl.config import load_edgectl_config
from edgectl.controller.store import Store
from edgectl.controller.webhooks import EVENT_TYPES, Delivery
from edgectl.fleet import open_store
from edgectl.fleet.webhooks import add_webhook, parse_status, redeliver, remove_webhook, webhook_deliveries

webhook_app = typer.Typer(help="Rollout and device events POSTed to other systems, signed (docs/integrations.md).",
                          no_args_is_help=True)
app.add_typer(webhook_app, name="webhook")

JSON = typer.Option(False, "--json", help="Print JSON.")


def _store(ctx: typer.Context) -> Store:
    return open_store(load_edgectl_config(options(ctx).config), must_exist=False)


def _when(ts: float | None) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ts)) if ts else "-"


def _secret(path: Path | None) -> str | None:
    if path is None:
        return None
    try:
        return path.read_text().strip()
    except OSError as exc:
        raise UserError(f"--secret-file {path}: {exc.strerror or exc}") from None


@webhook_app.command("add")
def webhook_add(ctx: typer.Context, url: str = typer.Argument(..., help="Where events are POSTed (http:// or https://)."),
                event: list[str] = typer.Option(["*"], "--event", "-e", help=f"An event type, a prefix like rollout.*, or * "
                                                f"(repeatable). Types: {', '.join(EVENT_TYPES)}."),
                secret_file: Path | None = typer.Option(None, "--secret-file", help="A file holding the HMAC key "
                                                        "(default: a random one, printed once)."),
                as_json: bool = JSON) -> None:
    """Subscribe URL to events; prints the signing secret once (keep it: it is never shown again)."""
    hook, secret = add_webhook(_store(ctx), url, event, _secret(secret_file), _actor())
    if as_json:
        print_json({**hook.to_dict(), "secret": secret})
        return
    console.print(f"webhook {hook.id} added: {hook.url} for {', '.join(hook.events)}")
    console.print(f"secret (shown once): {secret}")


@webhook_app.command("list")
def webhook_list(ctx: typer.Context, as_json: bool = JSON) -> None:
    """List webhooks (their secrets only as a hint)."""
    hooks = _store(ctx).webhooks()
    if as_json:
        print_json([h.to_dict() for h in hooks])
        return
    print_table("webhooks", ["ID", "URL", "EVENTS", "SECRET", "CREATED", "BY"],
                [(h.id, h.url, ", ".join(h.events), h.secret_hint, _when(h.created_at), h.created_by) for h in hooks])


@webhook_app.command("remove")
def webhook_remove(ctx: typer.Context, webhook_id: str = typer.Argument(..., help="Webhook id (see `edgectl webhook list`)."),
                   as_json: bool = JSON) -> None:
    """Remove a webhook and its delivery log; nothing more is sent to it."""
    hook = remove_webhook(_store(ctx), webhook_id, _actor())
    if as_json:
        print_json({"removed": hook.id})
    else:
        console.print(f"webhook {hook.id} removed ({hook.url})")


@webhook_app.command("deliveries")
def webhook_deliveries_command(
        ctx: typer.Context, webhook_id: str = typer.Argument(..., help="Webhook id (see `edgectl webhook list`)."),
        status: str | None = typer.Option(None, "--status", help="Only pending, delivered or failed deliveries."),
        limit: int = typer.Option(50, "--limit", min=1, max=1000, help="Newest deliveries to show."),
        as_json: bool = JSON) -> None:
    """A webhook's delivery log, newest first: attempts, the last answer or error, the next attempt."""
    found = webhook_deliveries(_store(ctx), webhook_id, parse_status(status), limit)
    if as_json:
        print_json([d.to_dict() for d in found])
        return
    print_table(f"deliveries of {webhook_id}", ["ID", "EVENT", "STATUS", "ATTEMPTS", "CODE", "ERROR", "NEXT", "CREATED"],
                [_row(d) for d in found])


def _row(d: Delivery) -> tuple[str, ...]:
    return (d.id, d.event, d.status.value, str(d.attempts), "-" if d.status_code is None else str(d.status_code),
            d.error[:60] or "-", _when(d.next_attempt) if d.status.value == "pending" else "-", _when(d.created_at))


@webhook_app.command("redeliver")
def webhook_redeliver(ctx: typer.Context,
                      delivery_id: str = typer.Argument(..., help="Delivery id (see `edgectl webhook deliveries`)."),
                      as_json: bool = JSON) -> None:
    """Send a delivery's event again: a new delivery with the same body, due now."""
    again = redeliver(_store(ctx), delivery_id, _actor())
    if as_json:
        print_json(again.to_dict())
    else:
        console.print(f"delivery {again.id} queued: {again.event} to webhook {again.webhook_id} again")

"""What ``edgectl webhook ...`` and ``/api/v1/webhooks`` do: add, list, remove, deliveries, redeliver.

Input is checked before anything is stored (:class:`~edgectl.controller.webhooks.WebhookInputError`
names the field); every change is audited with its actor, naming the webhook's host, never its
secret (nor the rest of its URL, which may carry a token of the receiver's).
"""

from __future__ import annotations

import time
import urllib.parse
from collections.abc import Callable, Sequence

from edgecore.errors import NotFoundError
from edgectl.controller.store import Store
from edgectl.controller.webhooks import (
    Delivery,
    DeliveryStatus,
    Webhook,
    WebhookInputError,
    new_id,
    parse_events,
    parse_secret,
    parse_url,
)

__all__ = ["add_webhook", "find_webhook", "parse_status", "redeliver", "remove_webhook", "webhook_deliveries"]


def add_webhook(store: Store, url: str, events: Sequence[str], secret: str | None, actor: str,
                clock: Callable[[], float] = time.time) -> tuple[Webhook, str]:
    """A new subscription: (its record, its secret: the given one or a new one, shown to the caller once)."""
    hook = Webhook(new_id("wh_"), parse_url(url), parse_events(events), parse_secret(secret), actor, clock())
    store.add_webhook(hook)
    store.audit("webhook added", f"{hook.id} to {_host(hook.url)} for {', '.join(hook.events)}", actor=actor)
    return hook, hook.secret


def find_webhook(store: Store, webhook_id: str) -> Webhook:
    hook = store.webhook(webhook_id)
    if hook is None:
        raise NotFoundError(f"no webhook {webhook_id!r} (see `edgectl webhook list`)")
    return hook


def remove_webhook(store: Store, webhook_id: str, actor: str) -> Webhook:
    hook = find_webhook(store, webhook_id)
    if not store.remove_webhook(webhook_id):
        raise NotFoundError(f"no webhook {webhook_id!r} (see `edgectl webhook list`)")
    store.audit("webhook removed", f"{hook.id} to {_host(hook.url)}", actor=actor)
    return hook


def parse_status(text: str | None) -> DeliveryStatus | None:
    if text is None:
        return None
    try:
        return DeliveryStatus(text)
    except ValueError:
        raise WebhookInputError("status", f"{text!r} is not one of {', '.join(s.value for s in DeliveryStatus)}") from None


def webhook_deliveries(store: Store, webhook_id: str, status: DeliveryStatus | None = None, limit: int = 100) -> list[Delivery]:
    """A webhook's delivery log, newest first."""
    find_webhook(store, webhook_id)
    return store.deliveries(webhook_id, status, limit)


def redeliver(store: Store, delivery_id: str, actor: str) -> Delivery:
    """Send a delivery's event again (a new delivery, due now), whatever became of the first."""
    again = store.redeliver(delivery_id, store.now())
    if again is None:
        raise NotFoundError(f"no delivery {delivery_id!r} of an existing webhook (see `edgectl webhook deliveries`)")
    store.audit("webhook redelivery", f"{again.id} of {delivery_id} ({again.event}) to webhook {again.webhook_id}", actor=actor)
    return again


def _host(url: str) -> str:
    return urllib.parse.urlsplit(url).hostname or "?"

"""Webhooks: rollout and device events POSTed to operators' URLs, signed with HMAC-SHA256, retried with backoff.

Events are derived in one place, the audit log: :data:`EVENTS` maps the audit actions that the engine,
the reports and the API write to event types, and ``Store.audit`` makes one delivery per matching
enabled webhook in the transaction of the audit entry itself (``store/webhooks.py``), so an event is
never lost between the decision and its delivery. :mod:`edgectl.controller.webhook_sender` sends them.

A delivery is a POST of the event's JSON with these headers (docs/integrations.md):

- ``X-Edgectl-Event``: the event type; ``X-Edgectl-Delivery``: the delivery's id (a redelivery has a new one,
  the event's ``id`` in the body stays); ``X-Edgectl-Timestamp``: Unix seconds of this attempt;
- ``X-Edgectl-Signature: sha256=<hex>``: HMAC-SHA256 of ``<timestamp>.<body>`` with the webhook's secret.
"""

from __future__ import annotations

import enum
import hashlib
import hmac
import json
import secrets
import urllib.parse
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from edgecore.errors import ConfigError, UserError

__all__ = ["EVENTS", "EVENT_TYPES", "HEADERS", "Attempt", "Delivery", "DeliveryStatus", "RetryPolicy", "Webhook", "WebhookEvent",
           "WebhookInputError", "delivery_from_row", "event_of", "new_id", "new_secret", "parse_events", "parse_secret",
           "parse_url", "sign", "webhook_from_row"]

# Audit actions (store.audit's ``action``) that are webhook events, and the event type each is sent as.
EVENTS: Mapping[str, str] = {
    "rollout created": "rollout.created",
    "wave started": "rollout.wave_started",
    "wave promoted": "rollout.wave_promoted",
    "rollout halted": "rollout.halted",
    "pause": "rollout.paused",  # the engine applied an operator's request (actor "operator")
    "resume": "rollout.resumed",
    "retry-failed": "rollout.retried",
    "rollout aborting": "rollout.aborting",
    "rollout aborted": "rollout.aborted",
    "rollout done": "rollout.done",
    "rollout rolled-back": "rollout.rolled_back",
    "rollout scheduled": "rollout.scheduled",
    "rollout awaiting approval": "rollout.awaiting_approval",
    "rollout approved": "rollout.approved",
    "rollout rejected": "rollout.rejected",
    "rollout started": "rollout.started",
    "device registered": "device.registered",
    "device failed": "device.deployment_failed",
    "device refused": "device.deployment_refused",
    "device rolled-back": "device.rolled_back",
    "device decommissioned": "device.decommissioned",
    "device deleted": "device.deleted",
    "package deleted": "package.deleted",
}
EVENT_TYPES: tuple[str, ...] = tuple(sorted(set(EVENTS.values())))
HEADERS = ("X-Edgectl-Event", "X-Edgectl-Delivery", "X-Edgectl-Timestamp", "X-Edgectl-Signature")
MAX_URL = 2048
MIN_SECRET = 16
SECRET_PREFIX = "whsec_"


class WebhookInputError(UserError):
    """A webhook's URL, events or secret that cannot be taken; ``field`` names which (the API's 400 says it)."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field


class DeliveryStatus(str, enum.Enum):
    PENDING = "pending"  # waiting for its next attempt (or being sent now)
    DELIVERED = "delivered"  # a 2xx answer
    FAILED = "failed"  # every attempt failed: kept in the log; redeliver sends it again

    def __str__(self) -> str:
        return str(self.value)


def event_of(action: str) -> str | None:
    """The event type an audit action is sent as, or None for actions that are no webhook event."""
    return EVENTS.get(action)


@dataclass(frozen=True)
class Webhook:
    """A subscription: where events go, which (patterns: ``rollout.*``, ``*``), signed with ``secret``."""

    id: str
    url: str
    events: tuple[str, ...]
    secret: str
    created_by: str
    created_at: float
    enabled: bool = True

    def wants(self, event_type: str) -> bool:
        return any(p == "*" or p == event_type or (p.endswith(".*") and event_type.startswith(p[:-1])) for p in self.events)

    @property
    def secret_hint(self) -> str:
        """Enough to tell secrets apart, never enough to sign: the last four characters."""
        return "…" + self.secret[-4:]

    def to_dict(self) -> dict[str, Any]:
        """The API's and the CLI's view: never the secret."""
        return {"id": self.id, "url": self.url, "events": list(self.events), "secret_hint": self.secret_hint,
                "created_by": self.created_by, "created_at": self.created_at, "enabled": self.enabled}


@dataclass(frozen=True)
class WebhookEvent:
    """What a delivery's body says (its JSON, the payload schema of docs/integrations.md)."""

    id: str
    type: str
    ts: float
    actor: str
    action: str
    rollout_id: str = ""
    device_id: str = ""
    detail: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {"id": self.id, "type": self.type, "ts": self.ts, "actor": self.actor, "action": self.action,
                "rollout_id": self.rollout_id or None, "device_id": self.device_id or None, "detail": self.detail}


@dataclass(frozen=True)
class Delivery:
    """One event on its way to one webhook: the exact body sent, and how its attempts went."""

    id: str
    webhook_id: str
    event_id: str
    event: str
    payload: str  # the body's JSON text, sent byte for byte on every attempt
    created_at: float
    status: DeliveryStatus
    attempts: int = 0
    status_code: int | None = None
    error: str = ""
    next_attempt: float | None = None
    last_attempt: float | None = None
    delivered_at: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"id": self.id, "webhook_id": self.webhook_id, "event_id": self.event_id, "event": self.event,
                "payload": json.loads(self.payload), "created_at": self.created_at, "status": self.status.value,
                "attempts": self.attempts, "status_code": self.status_code, "error": self.error,
                "next_attempt": self.next_attempt, "last_attempt": self.last_attempt, "delivered_at": self.delivered_at}


@dataclass(frozen=True)
class Attempt:
    """How one attempt of a delivery went, and what comes next (``next_attempt`` None: nothing more)."""

    at: float
    status: DeliveryStatus
    status_code: int | None = None
    error: str = ""
    next_attempt: float | None = None


@dataclass(frozen=True)
class RetryPolicy:
    """How deliveries are retried (config ``controller.webhooks``): ``attempts`` in all, the n-th retry after
    ``backoff_s * 2**(n-1)`` (at most ``max_backoff_s``) times a random factor within ``1 ± jitter``."""

    attempts: int = 8
    backoff_s: float = 10.0
    max_backoff_s: float = 3600.0
    jitter: float = 0.2
    timeout_s: float = 10.0  # one attempt, connecting and reading the answer together
    poll_s: float = 1.0  # how often the sender looks for due deliveries

    def __post_init__(self) -> None:
        bounds = {"attempts": (1, 100), "backoff_s": (0.001, 86400.0), "max_backoff_s": (self.backoff_s, 7 * 86400.0),
                  "jitter": (0.0, 0.99), "timeout_s": (0.05, 300.0), "poll_s": (0.01, 3600.0)}
        for name, (low, high) in bounds.items():
            value = getattr(self, name)
            if not low <= value <= high:  # NaN fails too
                raise ConfigError(f"controller.webhooks.{name}: {value} is outside {low:g}..{high:g}")

    @property
    def hold_s(self) -> float:
        """How long a sender's claim of a delivery lasts: past one attempt's timeout, with room to record it."""
        return self.timeout_s * 2 + 1.0

    def delay(self, attempts: int, uniform: Callable[[float, float], float]) -> float:
        """Seconds before the next attempt after ``attempts`` failed ones."""
        base = min(self.max_backoff_s, self.backoff_s * 2.0 ** max(0, attempts - 1))
        return base * uniform(1 - self.jitter, 1 + self.jitter)


def sign(secret: str, timestamp: str, body: bytes) -> str:
    """The ``X-Edgectl-Signature`` value: ``sha256=`` and the hex HMAC-SHA256 of ``<timestamp>.<body>``."""
    mac = hmac.new(secret.encode(), timestamp.encode() + b"." + body, hashlib.sha256)
    return "sha256=" + mac.hexdigest()


def new_id(prefix: str) -> str:
    """``wh_``, ``evt_`` or ``dlv_`` and 16 random hex digits."""
    return prefix + secrets.token_hex(8)


def new_secret() -> str:
    return SECRET_PREFIX + secrets.token_urlsafe(32)


def parse_url(text: str) -> str:
    """An http(s) URL with a host, no credentials and no fragment."""
    if len(text) > MAX_URL:
        raise WebhookInputError("url", f"longer than {MAX_URL} characters")
    if any(c.isspace() or ord(c) < 32 for c in text):
        raise WebhookInputError("url", "must not contain spaces or control characters")
    try:
        parts = urllib.parse.urlsplit(text)
        port = parts.port
    except ValueError as exc:
        raise WebhookInputError("url", f"not a URL ({exc})") from None
    if parts.scheme not in ("http", "https"):
        raise WebhookInputError("url", f"{parts.scheme or 'no'} scheme: use http:// or https://")
    if not parts.hostname:
        raise WebhookInputError("url", "names no host")
    if parts.username is not None or parts.password is not None:
        raise WebhookInputError("url", "must not carry credentials (the secret signs each delivery)")
    if parts.fragment:
        raise WebhookInputError("url", "must not have a #fragment")
    if port == 0:
        raise WebhookInputError("url", "port 0")
    return text


def parse_events(items: Iterable[str]) -> tuple[str, ...]:
    """Event types or patterns (``rollout.*``, ``*``); at least one, each naming some event."""
    patterns = tuple(dict.fromkeys(i.strip() for i in items))
    if not patterns:
        raise WebhookInputError("events", f"give at least one event type or pattern (* for all; known: {', '.join(EVENT_TYPES)})")
    for i, pattern in enumerate(patterns):
        probe = Webhook("", "", (pattern,), "", "", 0.0)
        if not any(probe.wants(t) for t in EVENT_TYPES):
            raise WebhookInputError(f"events[{i}]", f"{pattern!r} matches no event type (known: {', '.join(EVENT_TYPES)}, "
                                                   "a prefix like rollout.*, or *)")
    return patterns


def parse_secret(text: str | None) -> str:
    """The given secret (at least :data:`MIN_SECRET` printable characters), or a new random one."""
    if text is None:
        return new_secret()
    if len(text) < MIN_SECRET or not text.isprintable() or len(text) > 256:
        raise WebhookInputError("secret", f"use {MIN_SECRET} to 256 printable characters (or give none: one is made)")
    return text


def webhook_from_row(r: Mapping[str, Any]) -> Webhook:
    return Webhook(r["id"], r["url"], tuple(json.loads(r["events"])), r["secret"], r["created_by"] or "", r["created_at"],
                   bool(r["enabled"]))


def delivery_from_row(r: Mapping[str, Any]) -> Delivery:
    return Delivery(r["id"], r["webhook_id"], r["event_id"], r["event"], r["payload"], r["created_at"],
                    DeliveryStatus(r["status"]), int(r["attempts"]), r["status_code"], r["error"] or "", r["next_attempt"],
                    r["last_attempt"], r["delivered_at"])

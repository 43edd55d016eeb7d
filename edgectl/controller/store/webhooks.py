"""Webhook subscriptions and their deliveries (``webhooks``, ``webhook_deliveries``: migration 9), for both engines.

Deliveries are made by :meth:`WebhookSql._announce`, which ``audit`` calls inside the audit entry's own
transaction: an event is committed with its deliveries or not at all. A sender claims a due delivery
with one conditional UPDATE (``claimed_until`` in the past or none): of two replicas claiming the same
row, the database lets exactly one UPDATE change it, and a sender that dies holding a claim loses it
when ``claimed_until`` passes. Only the claim's holder records the attempt.
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import AbstractContextManager
from typing import Any

from edgectl.controller.webhooks import (
    Attempt,
    Delivery,
    DeliveryStatus,
    Webhook,
    WebhookEvent,
    delivery_from_row,
    event_of,
    new_id,
    webhook_from_row,
)
from edgectl.json_text import dumps

__all__ = ["WebhookSql"]

DELIVERY_COLUMNS = ("id", "webhook_id", "event_id", "event", "payload", "created_at", "status", "attempts", "next_attempt")
ADD_DELIVERY = (f"INSERT INTO webhook_deliveries({', '.join(DELIVERY_COLUMNS)}) "
                f"VALUES ({', '.join('?' * len(DELIVERY_COLUMNS))})")
CLAIM = ("UPDATE webhook_deliveries SET claimed_by=?, claimed_until=? WHERE id=? AND status=? "
         "AND (claimed_until IS NULL OR claimed_until < ?)")  # no claim, or a lapsed one
DUE = ("SELECT d.id FROM webhook_deliveries d JOIN webhooks w ON w.id = d.webhook_id WHERE d.status=? AND d.next_attempt <= ? "
       "AND w.enabled=1 AND (d.claimed_until IS NULL OR d.claimed_until < ?) ORDER BY d.next_attempt, d.id LIMIT ?")


class WebhookSql:
    """The webhook tables; a back-end supplies ``_execute``, ``_all`` and ``batch``."""

    def _execute(self, sql: str, args: Sequence[Any] = (), at_once: bool = False) -> Any:
        raise NotImplementedError

    def _all(self, sql: str, args: Sequence[Any] = ()) -> list[Any]:
        raise NotImplementedError

    def batch(self) -> AbstractContextManager[None]:
        raise NotImplementedError

    # -- subscriptions ----------------------------------------------------------------------------

    def add_webhook(self, hook: Webhook) -> None:
        self._execute("INSERT INTO webhooks(id, url, events, secret, created_by, created_at, enabled) VALUES (?,?,?,?,?,?,?)",
                      (hook.id, hook.url, dumps(list(hook.events)), hook.secret, hook.created_by, hook.created_at,
                       int(hook.enabled)))

    def webhooks(self) -> list[Webhook]:
        return [webhook_from_row(r) for r in self._all("SELECT * FROM webhooks ORDER BY created_at, id")]

    def webhook(self, webhook_id: str) -> Webhook | None:
        rows = self._all("SELECT * FROM webhooks WHERE id=?", (webhook_id,))
        return webhook_from_row(rows[0]) if rows else None

    def remove_webhook(self, webhook_id: str) -> bool:
        """Remove the subscription and its deliveries (sent or not); False when there is none."""
        with self.batch():
            self._execute("DELETE FROM webhook_deliveries WHERE webhook_id=?", (webhook_id,))
            return bool(self._execute("DELETE FROM webhooks WHERE id=?", (webhook_id,)).rowcount == 1)

    # -- deliveries -------------------------------------------------------------------------------

    def _announce(self, action: str, ts: float, actor: str, rollout_id: str, device_id: str, detail: str) -> int:
        """A delivery per enabled webhook that wants the audit action's event (in the caller's transaction)."""
        kind = event_of(action)
        if kind is None:
            return 0
        hooks = [h for h in (webhook_from_row(r) for r in self._all("SELECT * FROM webhooks WHERE enabled=1")) if h.wants(kind)]
        event = WebhookEvent(new_id("evt_"), kind, ts, actor, action, rollout_id, device_id, detail)
        payload = dumps(event.to_dict())
        for hook in hooks:
            self._execute(ADD_DELIVERY, (new_id("dlv_"), hook.id, event.id, kind, payload, ts, DeliveryStatus.PENDING.value,
                                         0, ts))
        return len(hooks)

    def deliveries(self, webhook_id: str | None = None, status: DeliveryStatus | None = None,
                   limit: int = 100) -> list[Delivery]:
        """Newest first."""
        sql, args = "SELECT * FROM webhook_deliveries WHERE 1=1", list[Any]()
        if webhook_id is not None:
            sql, args = sql + " AND webhook_id=?", [*args, webhook_id]
        if status is not None:
            sql, args = sql + " AND status=?", [*args, status.value]
        rows = self._all(sql + " ORDER BY created_at DESC, id DESC LIMIT ?", (*args, limit))
        return [delivery_from_row(r) for r in rows]

    def delivery(self, delivery_id: str) -> Delivery | None:
        rows = self._all("SELECT * FROM webhook_deliveries WHERE id=?", (delivery_id,))
        return delivery_from_row(rows[0]) if rows else None

    def claim_deliveries(self, worker: str, now: float, hold_s: float, limit: int = 20) -> list[tuple[Delivery, Webhook]]:
        """Pending deliveries due by ``now`` of enabled webhooks, each claimed for ``worker`` until ``now + hold_s``."""
        rows = self._all(DUE, (DeliveryStatus.PENDING.value, now, now, limit))
        claimed = []
        for r in rows:
            cursor = self._execute(CLAIM, (worker, now + hold_s, r["id"], DeliveryStatus.PENDING.value, now))
            if cursor.rowcount == 1:
                claimed.append(r["id"])
        found = []
        for delivery_id in claimed:
            delivery = self.delivery(delivery_id)
            hook = self.webhook(delivery.webhook_id) if delivery is not None else None
            if delivery is not None and hook is not None:
                found.append((delivery, hook))
        return found

    def record_attempt(self, delivery_id: str, worker: str, attempt: Attempt) -> bool:
        """Count one attempt and its outcome, releasing the claim; False when ``worker`` no longer holds it."""
        delivered = attempt.at if attempt.status is DeliveryStatus.DELIVERED else None
        cursor = self._execute(
            "UPDATE webhook_deliveries SET attempts=attempts+1, status=?, status_code=?, error=?, last_attempt=?, "
            "next_attempt=?, delivered_at=?, claimed_by=NULL, claimed_until=NULL WHERE id=? AND claimed_by=?",
            (attempt.status.value, attempt.status_code, attempt.error, attempt.at, attempt.next_attempt, delivered,
             delivery_id, worker))
        return bool(cursor.rowcount == 1)

    def prune_deliveries(self, before: float) -> int:
        """Delete delivered and failed deliveries made before ``before``; pending ones stay whatever their age."""
        cursor = self._execute("DELETE FROM webhook_deliveries WHERE created_at < ? AND status IN (?, ?)",
                               (before, DeliveryStatus.DELIVERED.value, DeliveryStatus.FAILED.value))
        return int(cursor.rowcount)

    def redeliver(self, delivery_id: str, now: float) -> Delivery | None:
        """A new pending delivery of the same event and body to the same webhook, due now; None when there is no such
        delivery (or its webhook is gone)."""
        old = self.delivery(delivery_id)
        if old is None or self.webhook(old.webhook_id) is None:
            return None
        new_delivery = new_id("dlv_")
        self._execute(ADD_DELIVERY, (new_delivery, old.webhook_id, old.event_id, old.event, old.payload, now,
                                     DeliveryStatus.PENDING.value, 0, now))
        return self.delivery(new_delivery)

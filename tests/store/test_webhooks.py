"""Webhook subscriptions and deliveries in the store, on SQLite and PostgreSQL: made with their audit entry, claimed once."""

from __future__ import annotations

import json
import threading

import pytest

from edgectl.controller.store import Store
from edgectl.controller.webhook_sender import WebhookSender
from edgectl.controller.webhooks import Attempt, DeliveryStatus, RetryPolicy, Webhook
from edgectl.fleet.lifecycle import decommission_device, delete_device
from tests.fleet import wait_for
from tests.store.conftest import MakeStore
from tests.webhook_receiver import Receiver

P, D, F = DeliveryStatus.PENDING, DeliveryStatus.DELIVERED, DeliveryStatus.FAILED


def hook(hook_id: str, *events: str, enabled: bool = True) -> Webhook:
    return Webhook(hook_id, f"http://127.0.0.1:9/{hook_id}", events, "s" * 20, "test", 1.0, enabled)


def test_an_audited_event_makes_one_delivery_per_webhook_that_wants_it(store: Store) -> None:
    for h in (hook("rollouts", "rollout.*"), hook("failures", "device.deployment_failed"), hook("all", "*"),
              hook("off", "*", enabled=False)):
        store.add_webhook(h)
    store.audit("wave started", "wave 1: 2 device(s)", "r1")
    store.audit("device failed", "install: no space", "r1", "d1")
    store.audit("device sent", "desired state published", "r1", "d1")  # no webhook event
    by_hook = {h: sorted(d.event for d in store.deliveries(h)) for h in ("rollouts", "failures", "all", "off")}
    assert by_hook == {"rollouts": ["rollout.wave_started"], "failures": ["device.deployment_failed"],
                       "all": ["device.deployment_failed", "rollout.wave_started"], "off": []}
    failed = store.deliveries("failures")[0]
    body = json.loads(failed.payload)
    assert body == {"id": failed.event_id, "type": "device.deployment_failed", "ts": body["ts"], "actor": "controller",
                    "action": "device failed", "rollout_id": "r1", "device_id": "d1", "detail": "install: no space"}
    assert failed.status is P and failed.attempts == 0 and failed.next_attempt == body["ts"]
    assert store.deliveries("all", F) == [] and len(store.deliveries("all", P)) == 2
    same_event = [d.event_id for d in store.deliveries() if d.event == "device.deployment_failed"]
    assert len(same_event) == 2 and len(set(same_event)) == 1, "one event, one id, whichever webhook gets it"


def test_deliveries_commit_with_their_audit_entry_or_not_at_all(store: Store) -> None:
    store.add_webhook(hook("all", "*"))
    with pytest.raises(RuntimeError), store.batch():
        store.audit("rollout halted", "gate failed", "r1")
        raise RuntimeError("the leader died before its commit")
    assert store.audit_log() == [] and store.deliveries() == []


def test_a_device_registers_once(store: Store) -> None:
    store.add_webhook(hook("all", "device.*"))
    store.upsert_device("d1", online=1, last_seen=1.0, presence_at=1.0)
    store.upsert_device("d1", online=0, last_seen=2.0, presence_at=2.0)
    assert [a.action for a in store.audit_log(device_id="d1")] == ["device registered"]
    assert [d.event for d in store.deliveries("all")] == ["device.registered"]


def test_two_replicas_claim_each_delivery_once(make_store: MakeStore) -> None:
    first, second = make_store(), make_store()
    first.add_webhook(hook("all", "*"))
    for i in range(20):
        first.audit("rollout created", "", f"r{i}")
    now = first.now() + 1
    claims: dict[str, list[str]] = {"a": [], "b": []}

    def claim(store: Store, worker: str) -> None:
        while found := store.claim_deliveries(worker, now, 30.0, 1):
            claims[worker] += [d.id for d, _ in found]
        store.release()

    threads = [threading.Thread(target=claim, args=(s, w)) for s, w in ((first, "a"), (second, "b"))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert sorted(claims["a"] + claims["b"]) == sorted(d.id for d in first.deliveries()), "each claimed exactly once"
    assert first.claim_deliveries("c", now, 30.0) == [], "held claims are not taken"
    taken = first.claim_deliveries("c", now + 31.0, 30.0, 1)  # the holder died: its claim lapsed
    assert len(taken) == 1
    delivery = taken[0][0]
    holder = "a" if delivery.id in claims["a"] else "b"
    assert not first.record_attempt(delivery.id, holder, Attempt(now, D, 200)), "a lapsed holder records nothing"
    assert first.record_attempt(delivery.id, "c", Attempt(now + 31, D, 204))
    done = first.delivery(delivery.id)
    assert done is not None and (done.status, done.attempts, done.status_code, done.delivered_at) == (D, 1, 204, now + 31)
    assert first.claim_deliveries("d", now + 100, 30.0, 100) and all(
        d.id != delivery.id for d, _ in first.claim_deliveries("d", now + 200, 30.0, 100)), "a delivered one is never due"


def test_retry_schedule_redelivery_and_removal(store: Store) -> None:
    store.add_webhook(hook("all", "*"))
    store.audit("rollout done", "", "r1")
    now = store.now() + 1
    (delivery, webhook), = store.claim_deliveries("w", now, 10.0)
    assert webhook.secret == "s" * 20
    assert store.record_attempt(delivery.id, "w", Attempt(now, P, 500, "HTTP 500: boom", now + 50))
    assert store.claim_deliveries("w", now + 10, 10.0) == [], "not due before its next attempt"
    (again, _), = store.claim_deliveries("w", now + 50, 10.0)
    assert store.record_attempt(again.id, "w", Attempt(now + 50, F, None, "ConnectionRefusedError"))
    failed = store.delivery(delivery.id)
    assert failed is not None and (failed.status, failed.attempts, failed.error) == (F, 2, "ConnectionRefusedError")
    redone = store.redeliver(delivery.id, now + 60)
    assert redone is not None and redone.id != delivery.id and redone.event_id == delivery.event_id
    assert (redone.payload, redone.status, redone.attempts) == (delivery.payload, P, 0)
    assert store.redeliver("dlv_none", now) is None
    assert store.remove_webhook("all") and not store.remove_webhook("all")
    assert store.deliveries() == [] and store.webhook("all") is None


def test_finished_deliveries_are_pruned_pending_ones_kept(store: Store) -> None:
    store.add_webhook(hook("all", "*"))
    for action in ("rollout created", "rollout done", "rollout halted"):
        store.audit(action, "", "r1")
    now = store.now() + 1
    outcomes = {"rollout.created": Attempt(now, D, 200), "rollout.done": Attempt(now, F, 500, "HTTP 500")}
    for delivery, _ in store.claim_deliveries("w", now, 10.0, 10):
        if delivery.event in outcomes:
            assert store.record_attempt(delivery.id, "w", outcomes[delivery.event])
    assert store.prune_deliveries(now - 3600) == 0, "younger than the limit: kept"
    assert store.prune_deliveries(now + 1) == 2
    assert [d.event for d in store.deliveries()] == ["rollout.halted"], "a pending delivery is never pruned"


def test_two_replicas_senders_deliver_each_event_once(make_store: MakeStore) -> None:
    receiver = Receiver("s" * 20, [200])
    stores = [make_store(), make_store()]
    stores[0].add_webhook(Webhook("all", receiver.url, ("*",), "s" * 20, "test", 1.0))
    senders = [WebhookSender(s, RetryPolicy(poll_s=0.02)).start() for s in stores]
    try:
        for i in range(12):
            stores[i % 2].audit("rollout created", "", f"r{i}")
        wait_for(lambda: len(stores[0].deliveries("all", D)) == 12, 20, "12 deliveries")
    finally:
        for sender in senders:
            sender.stop()
        receiver.stop()
    sent = [h.headers["X-Edgectl-Delivery"] for h in receiver.hits]
    assert sorted(sent) == sorted(d.id for d in stores[0].deliveries("all")) and all(h.verified for h in receiver.hits)


def test_an_operators_decommission_and_delete_are_device_events(store: Store) -> None:
    """The lifecycle's audit actions are in the event table: a subscriber to device.* hears of both."""
    store.add_webhook(hook("devices", "device.*"))
    store.upsert_device("d9", online=1, presence_at=1.0)
    decommission_device(store, "d9", "api:ops", None)
    delete_device(store, "d9", "api:ops")
    assert sorted(d.event for d in store.deliveries("devices")) == ["device.decommissioned", "device.deleted",
                                                                   "device.registered"]

"""Webhook deliveries end to end: real HTTP receivers that check each signature with the code docs/integrations.md shows.

Retries with growing gaps, a receiver that is down, a wrong secret, a redirect, a receiver that never
answers, and a real ``edgectl controller run`` killed with a delivery pending, whose next process sends it.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from edgectl.controller.store import Retention, SqliteStore, Store
from edgectl.controller.webhook_sender import WebhookSender
from edgectl.controller.webhooks import Attempt, DeliveryStatus, RetryPolicy, Webhook
from tests.brokers import free_port
from tests.control.conftest import ControlPlane
from tests.fleet import wait_for
from tests.webhook_receiver import Receiver

SECRET = "receiver-secret-0123456789"
FAST = RetryPolicy(attempts=4, backoff_s=0.2, max_backoff_s=5.0, jitter=0.2, timeout_s=2.0, poll_s=0.05)


@pytest.fixture
def receivers() -> Iterator[Callable[..., Receiver]]:
    started: list[Receiver] = []

    def start(answers: list[int], secret: str = SECRET, **kw: object) -> Receiver:
        started.append(Receiver(secret, answers, **kw))  # type: ignore[arg-type]
        return started[-1]

    yield start
    for r in started:
        r.stop()


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    opened = SqliteStore(tmp_path / "store.db")
    yield opened
    opened.close()


def sending(store: Store, url: str, policy: RetryPolicy = FAST) -> WebhookSender:
    store.add_webhook(Webhook("wh_test", url, ("*",), SECRET, "test", time.time()))
    return WebhookSender(store, policy).start()


def settled(store: Store) -> Callable[[], object]:
    return lambda: [d for d in store.deliveries("wh_test") if d.status is not DeliveryStatus.PENDING]


def test_retried_with_growing_gaps_until_the_receiver_answers_2xx(store: Store, receivers: Callable[..., Receiver]) -> None:
    receiver = receivers([500, 500, 200])
    sender = sending(store, receiver.url)
    try:
        store.audit("rollout halted", "wave 2: gate 'error_rate <= 1%' failed", "r1")
        (done,) = wait_for(settled(store), 15, "the delivery to settle")
    finally:
        sender.stop()
    assert (done.status, done.attempts, done.status_code, done.error) == (DeliveryStatus.DELIVERED, 3, 200, "")
    assert [h.verified for h in receiver.hits] == [True, True, True]
    assert {h.headers["X-Edgectl-Delivery"] for h in receiver.hits} == {done.id}
    assert {h.headers["X-Edgectl-Event"] for h in receiver.hits} == {"rollout.halted"}
    body = json.loads(receiver.hits[0].body)
    assert (body["type"], body["rollout_id"], body["id"]) == ("rollout.halted", "r1", done.event_id)
    first, second = (b.at - a.at for a, b in zip(receiver.hits, receiver.hits[1:], strict=False))
    assert 0.16 <= first < second, f"backoff did not grow: {first:.2f}s then {second:.2f}s"
    assert second >= 0.32


def test_a_receiver_that_is_down_ends_failed_after_the_limit(store: Store, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, "edgectl.controller.webhook_sender")
    sender = sending(store, f"http://127.0.0.1:{free_port()}/hook", RetryPolicy(attempts=3, backoff_s=0.05, poll_s=0.05))
    try:
        store.audit("device failed", "install: no space left", "r1", "d1")
        (done,) = wait_for(settled(store), 15, "the delivery to fail")
    finally:
        sender.stop()
    assert (done.status, done.attempts, done.status_code) == (DeliveryStatus.FAILED, 3, None)
    assert "ConnectionRefusedError" in done.error
    assert f"delivery {done.id} of device.deployment_failed failed after 3 attempt(s)" in caplog.text
    assert SECRET not in caplog.text, "a secret was logged"


def test_a_wrong_secret_fails_verification(store: Store, receivers: Callable[..., Receiver]) -> None:
    receiver = receivers([200], secret="not-the-secret-it-was-signed-with")
    sender = sending(store, receiver.url, RetryPolicy(attempts=2, backoff_s=0.05, poll_s=0.05))
    try:
        store.audit("rollout done", "", "r1")
        (done,) = wait_for(settled(store), 15, "the delivery to fail")
    finally:
        sender.stop()
    assert [h.verified for h in receiver.hits] == [False, False]
    assert (done.status, done.status_code) == (DeliveryStatus.FAILED, 401)
    hit = receiver.hits[0]
    assert receiver.verify(SECRET, hit.headers, hit.body), "the right secret verifies the same delivery"
    assert not receiver.verify(SECRET, hit.headers, hit.body.replace(b"r1", b"r2")), "a changed body verifies"
    stale = {**hit.headers, "X-Edgectl-Timestamp": str(int(time.time()) - 3600)}
    assert not receiver.verify(SECRET, stale, hit.body), "an old timestamp verifies"


def test_a_redirect_is_never_followed(store: Store, receivers: Callable[..., Receiver]) -> None:
    elsewhere = receivers([200])
    redirecting = receivers([302], location=elsewhere.url)
    sender = sending(store, redirecting.url, RetryPolicy(attempts=1, poll_s=0.05))
    try:
        store.audit("rollout created", "", "r1")
        (done,) = wait_for(settled(store), 15, "the delivery to fail")
    finally:
        sender.stop()
    assert (done.status, done.status_code) == (DeliveryStatus.FAILED, 302)
    assert done.error == f"HTTP 302: redirect to {elsewhere.url} not followed"
    assert len(redirecting.hits) == 1 and elsewhere.hits == []


def test_an_attempt_ends_at_its_timeout(store: Store, receivers: Callable[..., Receiver]) -> None:
    stalling = receivers([200], trickle_s=0.1)  # every read answered within the timeout; the answer never ends
    sender = sending(store, stalling.url, RetryPolicy(attempts=1, timeout_s=0.5, poll_s=0.05))
    started = time.monotonic()
    try:
        store.audit("rollout created", "", "r1")
        (done,) = wait_for(settled(store), 15, "the delivery to time out")
    finally:
        sender.stop()
    assert time.monotonic() - started < 2.5, "the attempt outlasted its timeout"
    assert (done.status, done.error) == (DeliveryStatus.FAILED, "no answer within 0.5s")


def test_finished_deliveries_older_than_the_retention_are_pruned_hourly(tmp_path: Path) -> None:
    store = SqliteStore(tmp_path / "kept.db", Retention(max_age_s=1.0))
    store.add_webhook(Webhook("wh_test", "http://127.0.0.1:9/", ("*",), SECRET, "test", time.time()))
    store.audit("rollout done", "", "r1")
    ((delivery, _),) = store.claim_deliveries("w", store.now(), 10.0)
    store.record_attempt(delivery.id, "w", Attempt(store.now(), DeliveryStatus.DELIVERED, 200))
    now = [store.now()]
    sender = WebhookSender(store, FAST, clock=lambda: now[0])
    assert sender.prune() == 0 and store.delivery(delivery.id) is not None, "pruned before it was a second old"
    now[0] += 2.0
    assert sender.prune() == 0, "pruned again within the hour"
    sender._pruned_at -= 3600
    assert sender.prune() == 1 and store.deliveries() == []
    store.close()


def test_a_pending_delivery_is_sent_after_the_controller_restarts(plane: ControlPlane,
                                                                  receivers: Callable[..., Receiver]) -> None:
    plane.configure({"controller": {"webhooks": {"attempts": 50, "backoff_s": 0.3, "max_backoff_s": 0.6, "timeout_s": 1.0,
                                                 "poll_s": 0.1}}})
    receiver = receivers([503])
    added = json.loads(plane.edgectl("webhook", "add", receiver.url, "--event", "device.*", "--json", check=True).stdout)
    receiver.secret = added["secret"]
    controller = plane.controller_process()
    plane.agents(1)
    wait_for(lambda: len(receiver.hits) >= 2, 60, "two refused attempts")
    controller.kill()
    (pending,) = plane.store().deliveries(added["id"])
    assert (pending.status, pending.event) == (DeliveryStatus.PENDING, "device.registered") and pending.attempts >= 2
    receiver.answers = [200]
    plane.controller_process()
    wait_for(lambda: plane.store().deliveries(added["id"], DeliveryStatus.DELIVERED), 60, "the delivery after the restart")
    assert all(h.verified for h in receiver.hits)
    assert {h.headers["X-Edgectl-Delivery"] for h in receiver.hits} == {pending.id}
    listed = json.loads(plane.edgectl("webhook", "deliveries", added["id"], "--json", check=True).stdout)
    assert [(d["id"], d["status"], d["payload"]["device_id"]) for d in listed] == [(pending.id, "delivered", "sim-000")]

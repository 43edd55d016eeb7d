"""Sends webhook deliveries: a thread of ``edgectl controller run``, safe on every replica.

Each poll claims the due deliveries in the store (``Store.claim_deliveries``: two replicas never
claim the same one), POSTs each with its signature, and records the attempt: a 2xx answer delivers
it; anything else (another status, a redirect, a refused connection, a timeout) schedules the next
attempt after the :class:`~edgectl.controller.webhooks.RetryPolicy`'s backoff, until the last one
marks it failed. Redirects are never followed. One attempt takes at most ``timeout_s``: a watchdog
shuts the connection however slowly the receiver answers. Secrets are never logged.
"""

from __future__ import annotations

import contextlib
import http.client
import logging
import os
import random
import secrets
import socket
import ssl
import threading
import time
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass

from edgecore import __version__
from edgectl.controller.store import Store, StoreUnavailable
from edgectl.controller.webhooks import Attempt, Delivery, DeliveryStatus, RetryPolicy, Webhook, sign

__all__ = ["Answer", "WebhookSender", "post"]

log = logging.getLogger(__name__)

PRUNE_EVERY_S = 3600.0  # finished deliveries older than the store's retention (max_age_s) go this often
CLAIM_LIMIT = 50  # deliveries attempted per poll at most (claimed and sent one after the other)
ANSWER_BYTES = 4096  # of a receiver's answer, read for the delivery log
ERROR_CHARS = 200


@dataclass(frozen=True)
class Answer:
    """What one POST got: the status (None: no answer) and, unless 2xx, why it counts as failed."""

    status_code: int | None
    error: str = ""

    @property
    def ok(self) -> bool:
        return self.status_code is not None and 200 <= self.status_code < 300


Post = Callable[[str, bytes, dict[str, str], float], Answer]


def post(url: str, body: bytes, headers: dict[str, str], timeout_s: float) -> Answer:
    """POST ``body`` to ``url`` within ``timeout_s`` in all; never follows a redirect."""
    parts = urllib.parse.urlsplit(url)
    host, port = parts.hostname or "", parts.port
    if parts.scheme == "https":
        conn: http.client.HTTPConnection = http.client.HTTPSConnection(host, port, timeout=timeout_s,
                                                                       context=ssl.create_default_context())
    else:
        conn = http.client.HTTPConnection(host, port, timeout=timeout_s)
    cut = threading.Event()  # set when the watchdog closed the connection: whatever error follows is the timeout's
    watchdog = threading.Timer(timeout_s, _cut, (conn, cut))
    watchdog.start()
    try:
        conn.request("POST", (parts.path or "/") + (f"?{parts.query}" if parts.query else ""), body=body, headers=headers)
        response = conn.getresponse()
        text = response.read(ANSWER_BYTES).decode("utf-8", "replace")
    except (OSError, http.client.HTTPException) as exc:
        return Answer(None, f"no answer within {timeout_s:g}s" if cut.is_set() else f"{type(exc).__name__}: {exc}"[:ERROR_CHARS])
    finally:
        watchdog.cancel()
        conn.close()
    code = response.status
    if 300 <= code < 400:
        return Answer(code, f"HTTP {code}: redirect to {response.getheader('Location', '?')[:100]} not followed")
    if not 200 <= code < 300:
        return Answer(code, f"HTTP {code}: {' '.join(text.split())}"[:ERROR_CHARS])
    return Answer(code)


def _cut(conn: http.client.HTTPConnection, cut: threading.Event) -> None:
    """The attempt's time is up: end its socket, which fails whatever read or write waits on it."""
    cut.set()
    sock = conn.sock
    if sock is not None:
        with contextlib.suppress(OSError):  # closed meanwhile
            sock.shutdown(socket.SHUT_RDWR)


class WebhookSender:
    """Claims and sends due deliveries every ``policy.poll_s``; ``send_due()`` runs one poll (tests call it)."""

    def __init__(self, store: Store, policy: RetryPolicy, clock: Callable[[], float] | None = None,
                 uniform: Callable[[float, float], float] = random.uniform, send: Post = post) -> None:
        self.store, self.policy, self.uniform, self.send = store, policy, uniform, send
        self.clock = clock or store.now
        self.worker = f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(4)}"
        self.stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self._pruned_at = -PRUNE_EVERY_S  # monotonic
        self._down = False  # the store was unavailable at the last poll (said once)

    def start(self) -> WebhookSender:
        self._thread = threading.Thread(target=self._run, name="webhook-sender", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self.stopping.set()
        if self._thread is not None:
            self._thread.join(self.policy.timeout_s + 5.0)

    def _run(self) -> None:
        while not self.stopping.wait(self.policy.poll_s):
            try:
                self.send_due()
                self.prune()
                self._down = False
            except StoreUnavailable as exc:  # claimed deliveries come back when their claim lapses
                if not self._down:
                    log.warning("webhooks: %s; deliveries wait until it answers", exc)
                self._down = True
            except Exception:  # never let one bad row end the sender
                log.exception("webhooks: sending failed")
            finally:
                self.store.release()

    def prune(self) -> int:
        """Once an hour: drop finished deliveries older than the store's retention (``controller.retention.max_age_days``)."""
        keep_s = self.store.retention.max_age_s
        if keep_s <= 0 or time.monotonic() - self._pruned_at < PRUNE_EVERY_S:
            return 0
        self._pruned_at = time.monotonic()
        return self.store.prune_deliveries(self.clock() - keep_s)

    def send_due(self) -> int:
        """Claim what is due now and attempt each; return how many were attempted."""
        sent = 0
        while sent < CLAIM_LIMIT and not self.stopping.is_set():  # one at a time: a claim lasts one attempt
            claimed = self.store.claim_deliveries(self.worker, self.clock(), self.policy.hold_s, 1)
            if not claimed:
                break
            self._attempt(*claimed[0])
            sent += 1
        return sent

    def _attempt(self, delivery: Delivery, hook: Webhook) -> None:
        body = delivery.payload.encode()
        stamp = str(int(self.clock()))
        headers = {"Content-Type": "application/json", "User-Agent": f"edgectl-webhooks/{__version__}",
                   "X-Edgectl-Event": delivery.event, "X-Edgectl-Delivery": delivery.id, "X-Edgectl-Timestamp": stamp,
                   "X-Edgectl-Signature": sign(hook.secret, stamp, body)}
        answer = self.send(hook.url, body, headers, self.policy.timeout_s)
        attempt = self._outcome(delivery, answer, self.clock())
        if not self.store.record_attempt(delivery.id, self.worker, attempt):
            log.warning("webhooks: delivery %s was claimed by another sender or removed meanwhile: outcome not recorded",
                        delivery.id)
        elif attempt.status is DeliveryStatus.FAILED:
            log.warning("webhook %s: delivery %s of %s failed after %d attempt(s): %s", hook.id, delivery.id, delivery.event,
                        delivery.attempts + 1, answer.error)
        elif attempt.status is DeliveryStatus.PENDING:
            log.info("webhook %s: delivery %s attempt %d: %s; next in %.1fs", hook.id, delivery.id, delivery.attempts + 1,
                     answer.error, (attempt.next_attempt or attempt.at) - attempt.at)

    def _outcome(self, delivery: Delivery, answer: Answer, now: float) -> Attempt:
        if answer.ok:
            return Attempt(now, DeliveryStatus.DELIVERED, answer.status_code)
        attempts = delivery.attempts + 1
        if attempts >= self.policy.attempts:
            return Attempt(now, DeliveryStatus.FAILED, answer.status_code, answer.error)
        return Attempt(now, DeliveryStatus.PENDING, answer.status_code, answer.error,
                       now + self.policy.delay(attempts, self.uniform))

"""The console's Webhooks page in Chromium: add (the secret shown once), a refused URL, the delivery log with its status
filter, redeliver, delete with confirmation, and what a viewer sees.

The API server runs in this process (the real route table and console files, a SQLite store), with a webhook sender
on the same store and a real receiver that checks each signature: no controller or fleet is needed here.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from edgectl.api.accounts import Accounts
from edgectl.api.app import api_context, api_routes
from edgectl.api.server import ApiServer
from edgectl.config import EdgectlConfig
from edgectl.controller.accounts import ROLES
from edgectl.controller.store import SqliteStore
from edgectl.controller.webhook_sender import WebhookSender
from edgectl.controller.webhooks import DeliveryStatus, RetryPolicy
from edgectl.keys import Keyring
from tests.console.browser import Browser, missing
from tests.fleet import wait_for
from tests.webhook_receiver import Receiver


@dataclass
class Console:
    store: SqliteStore
    tokens: dict[str, str]
    receiver: Receiver
    browser: Browser


@pytest.fixture
def console(tmp_path: Path) -> Iterator[Console]:
    reason = missing()
    if reason:
        pytest.skip(reason)
    store = SqliteStore(tmp_path / "store.db")
    ctx = api_context(store, EdgectlConfig(), keyring=Keyring(tmp_path / "keys"))
    accounts = Accounts(store)
    tokens = {}
    for role in ROLES:
        accounts.add_user(role.value, role, "test")
        tokens[role.value] = accounts.create_token(role.value, "", None, "test")[1]
    server = ApiServer(ctx, api_routes(ctx), "127.0.0.1", 0).start()
    sender = WebhookSender(store, RetryPolicy(attempts=1, timeout_s=2.0, poll_s=0.1)).start()
    receiver = Receiver("", [500])
    browser = Browser(f"{server.url}/console/", poll_ms=300)
    try:
        yield Console(store, tokens, receiver, browser)
    finally:
        browser.close()
        receiver.stop()
        sender.stop()
        server.stop()
        store.close()


def test_add_watch_deliveries_redeliver_and_delete_a_webhook(console: Console) -> None:
    browser, store, receiver = console.browser, console.store, console.receiver
    browser.sign_in(console.tokens["admin"])
    browser.go("/webhooks", ready="webhooks")
    assert browser.text("#webhooks-table") == "No webhook yet."

    browser.css("#webhook-url").send_keys("ftp://hooks.example.com/edge")
    browser.click("#add-webhook button")
    browser.wait(lambda: browser.text("#flash").startswith("url: ftp scheme"), 10, "the refused URL")
    assert store.webhooks() == []

    browser.css("#webhook-url").clear()
    browser.css("#webhook-url").send_keys(receiver.url)
    browser.css("#webhook-events").clear()
    browser.css("#webhook-events").send_keys("rollout.*, device.deployment_failed")
    browser.click("#add-webhook button")
    receiver.secret = browser.text("#new-secret")
    (hook,) = store.webhooks()
    assert hook.secret == receiver.secret and hook.events == ("rollout.*", "device.deployment_failed")
    row = browser.text(f'tr[data-webhook="{hook.id}"]')
    assert receiver.url in row and hook.secret_hint in row

    store.audit("rollout halted", "wave 1: gate 'error_rate <= 1%' failed", "r1")  # the receiver answers 500: failed
    wait_for(lambda: store.deliveries(hook.id, DeliveryStatus.FAILED), 20, "the failed delivery")
    browser.click(f'tr[data-webhook="{hook.id}"] a')
    browser.ready("webhooks")
    (failed,) = store.deliveries(hook.id)
    browser.wait(lambda: "HTTP 500" in browser.text(f'tr[data-delivery="{failed.id}"]'), 10, "the failed delivery listed")
    assert "rollout.halted" in browser.text(f'tr[data-delivery="{failed.id}"]')

    receiver.answers = [200]
    browser.click(f'button[data-redeliver="{failed.id}"]')
    again = wait_for(lambda: store.deliveries(hook.id, DeliveryStatus.DELIVERED), 20, "the redelivery")[0]
    browser.wait(lambda: browser.attributes(f'tr[data-delivery="{again.id}"]', "data-status") == ["delivered"], 10,
                 "the redelivery shown delivered")
    assert [h.verified for h in receiver.hits] == [True, True]

    browser.js("const s = document.getElementById('delivery-status'); s.value = 'failed'; s.dispatchEvent(new Event('change'));")
    browser.ready("webhooks")
    browser.wait(lambda: browser.attributes("tr[data-delivery]", "data-status") == ["failed"], 10, "only failed ones")

    browser.go("/webhooks", ready="webhooks")
    assert receiver.secret not in browser.text("#main")
    browser.click(f'button[data-remove="{hook.id}"]')
    browser.wait(lambda: browser.css("#confirm").is_displayed(), 10, "the confirmation dialog")
    browser.click("#confirm-ok")
    browser.wait(lambda: browser.text("#webhooks-table") == "No webhook yet.", 10, "the webhook gone")
    assert store.webhooks() == [] and store.deliveries() == []

    browser.sign_out()
    browser.sign_in(console.tokens["viewer"])
    browser.go("/webhooks", ready="webhooks")
    assert "Operators and admins see webhooks" in browser.text("#main")

"""The rules behind the operator workflows, in process and at their edges: webhook input and retry bounds, the
two-person rule, and the agent's handling of remote configuration versions (what ./scripts/mutants checks)."""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from agent.remote_config import RemoteConfig
from edgecore.errors import ConfigError, OperationFailed, ProtocolError, UserError
from edgecore.protocol.device_config import CONFIG_TYPE
from edgecore.protocol.envelope import TrustedKeys, sign
from edgecore.protocol.schema import encode_json
from edgectl.controller.planner import Plan, PlannedDevice
from edgectl.controller.store import SqliteStore
from edgectl.controller.submit import RolloutOptions, submit_rollout
from edgectl.controller.webhooks import (
    MAX_URL,
    MIN_SECRET,
    RetryPolicy,
    Webhook,
    WebhookInputError,
    parse_events,
    parse_secret,
    parse_url,
)
from edgectl.fleet.approvals import MAX_REASON, approval_reason, approve_rollout, person, reject_reason

# -- webhooks ---------------------------------------------------------------------------------------------------------


def test_webhook_urls_are_http_with_a_host_and_nothing_that_leaks_or_cannot_be_reached() -> None:
    longest = "https://hooks.example/" + "a" * (MAX_URL - len("https://hooks.example/"))
    assert parse_url(longest) == longest and parse_url("http://hooks.example:1/x") == "http://hooks.example:1/x"
    for bad, says in [(longest + "a", "longer than"), ("https://hooks.example/a b", "spaces or control"),
                      ("https://hooks.example/\x01", "control"), ("ftp://hooks.example/", "scheme"), ("https:///path", "no host"),
                      ("https://user@hooks.example/", "credentials"), ("https://:pw@hooks.example/", "credentials"),
                      ("https://hooks.example/#top", "fragment"), ("https://hooks.example:0/", "port 0")]:
        with pytest.raises(WebhookInputError, match=says):
            parse_url(bad)


def test_webhook_events_and_secrets_are_checked() -> None:
    assert parse_events(["rollout.*", "rollout.*", " device.registered "]) == ("rollout.*", "device.registered")
    with pytest.raises(WebhookInputError, match="at least one event"):
        parse_events([])
    with pytest.raises(WebhookInputError, match=r"'rollouts\.\*' matches no event type") as refused:
        parse_events(["*", "rollouts.*"])
    assert refused.value.field == "events[1]"
    hook = Webhook("wh", "https://h/", ("rollout.*",), "s" * MIN_SECRET, "ann", 0.0)
    assert hook.wants("rollout.halted") and not hook.wants("device.registered") and not hook.wants("rollouts.halted")
    assert parse_secret("s" * MIN_SECRET) == "s" * MIN_SECRET and parse_secret("s" * 256) == "s" * 256
    for bad in ("s" * (MIN_SECRET - 1), "s" * 257, "s" * MIN_SECRET + "\n"):
        with pytest.raises(WebhookInputError, match="printable characters"):
            parse_secret(bad)
    assert len(parse_secret(None)) >= MIN_SECRET  # none given: one is made


@pytest.mark.parametrize(("name", "highest", "over"), [
    ("attempts", 100, 101), ("backoff_s", 86400.0, 86401.0), ("max_backoff_s", 7 * 86400.0, 7 * 86400.0 + 1),
    ("jitter", 0.99, 1.0), ("timeout_s", 300.0, 301.0), ("poll_s", 3600.0, 3601.0),
])
def test_retry_settings_are_bounded(name: str, highest: float, over: float) -> None:
    room: dict[str, Any] = {"max_backoff_s": 7 * 86400.0} if name == "backoff_s" else {}  # the cap is at least the first
    assert getattr(RetryPolicy(**{**room, name: highest}), name) == highest
    for bad in (over, float("nan")):
        with pytest.raises(ConfigError, match=f"controller.webhooks.{name}: "):
            RetryPolicy(**{**room, name: bad})


def test_retries_back_off_doubling_to_a_cap_within_the_jitter() -> None:
    asked: list[tuple[float, float]] = []

    def middle(low: float, high: float) -> float:
        asked.append((low, high))
        return 1.0
    policy = RetryPolicy(backoff_s=10.0, max_backoff_s=50.0, jitter=0.2)
    assert [policy.delay(n, middle) for n in (0, 1, 2, 3, 4)] == [10.0, 10.0, 20.0, 40.0, 50.0]
    assert set(asked) == {(0.8, 1.2)}
    assert policy.hold_s > policy.timeout_s  # a claim outlives the attempt it covers


# -- the two-person rule ----------------------------------------------------------------------------------------------


def _plan(count: int) -> Plan:
    return Plan([PlannedDevice(f"d{i}", 1, None, None) for i in range(count)], {}, 0.0, waves=1)


def test_who_counts_as_one_person_and_what_a_rejection_must_say(tmp_path: Path) -> None:
    assert person("cli:alice") == person("api:alice") == "alice" and person("alice") == "alice"
    assert person("api:oidc:alice") == "oidc:alice" != person("api:oidc:bob")  # single sign-on users are told apart
    assert reject_reason("  not before the audit  ") == "not before the audit"
    assert reject_reason("x" * 500) == "x" * 500 == "x" * MAX_REASON  # docs/fleet.md: at most 500 characters
    for bad in ("", "   ", "x" * 501, "two\nlines"):
        with pytest.raises(UserError, match="reason: say why in one line"):
            reject_reason(bad)
    store = SqliteStore(tmp_path / "store.db")
    assert approval_reason(store, "all", _plan(2), 1) != "" and approval_reason(store, "all", _plan(1), 1) == ""


def test_an_approval_says_when_the_rollout_starts(tmp_path: Path) -> None:
    store = SqliteStore(tmp_path / "store.db")
    now = time.time()
    at_once = submit_rollout(store, _plan(1), RolloutOptions("all", 0.05, 0.0, [], approval="size"), actor="cli:ann")
    later = submit_rollout(store, _plan(1), RolloutOptions("all", 0.05, 0.0, [], approval="size", start_at=now + 3600),
                           actor="cli:ann")
    approve_rollout(store, at_once, "api:bob")
    approve_rollout(store, later, "api:bob")
    said = {e.rollout_id: e.detail for e in store.audit_log() if e.action == "rollout approved"}
    assert said[at_once].endswith("starts at once")
    assert said[later].endswith(f"starts at {time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime(now + 3600))}")


# -- remote configuration versions on the agent -----------------------------------------------------------------------

DEVICE = "cam-1"


class Controller:
    """Signs configurations for DEVICE as the controller would."""

    def __init__(self) -> None:
        self.key = Ed25519PrivateKey.generate()

    def keys(self) -> TrustedKeys:
        return TrustedKeys([self.key.public_key()])

    def config(self, version: int, settings: dict[str, object], device: str = DEVICE) -> bytes:
        now = time.time()
        body = {"type": "config", "device_id": device, "version": version, "issued_at": now, "expires_at": now + 600,
                "settings": settings}
        return sign(CONFIG_TYPE, encode_json(body), self.key).to_bytes()


def test_versions_already_handled_are_taken_quietly_and_older_live_ones_are_replays(tmp_path: Path) -> None:
    controller = Controller()
    remote = RemoteConfig(tmp_path, DEVICE, controller.keys)
    refused = remote.take(controller.config(1, {"log_level": "LOUD"}), retained=False)
    assert refused is not None and refused.status.value == "refused" and refused.applied_version == 0  # none in force
    applied = remote.take(controller.config(2, {"log_level": "DEBUG"}), retained=False)
    assert applied is not None and applied.applied_version == 2
    assert remote.take(controller.config(2, {"log_level": "DEBUG"}), retained=False) is None  # the re-signed copy
    assert remote.take(controller.config(1, {}), retained=True) is None  # the broker's old copy on a reconnect
    with pytest.raises(ProtocolError, match="version 1 <= last handled 2"):
        remote.take(controller.config(1, {}), retained=False)
    assert json.loads((tmp_path / "config.json").read_text())["schema"] == 1  # the saved file's format


def test_a_configuration_that_cannot_be_saved_changes_nothing(tmp_path: Path) -> None:
    controller = Controller()
    remote = RemoteConfig(tmp_path, DEVICE, controller.keys)
    (tmp_path / "config.json").mkdir()  # the file cannot be written: a directory is in its place
    with pytest.raises(OperationFailed, match="cannot save the configuration"):
        remote.take(controller.config(1, {"log_level": "DEBUG"}), retained=False)
    assert remote.applied is None and remote.status is None


def test_a_saved_file_of_another_format_is_not_trusted(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    controller = Controller()
    with caplog.at_level(logging.ERROR):
        assert RemoteConfig(tmp_path, DEVICE, controller.keys).applied is None  # no file: nothing to say
    assert not caplog.records
    RemoteConfig(tmp_path, DEVICE, controller.keys).take(controller.config(1, {"log_level": "DEBUG"}), retained=False)
    saved = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**saved, "schema": 2}))
    with caplog.at_level(logging.ERROR):
        reread = RemoteConfig(tmp_path, DEVICE, controller.keys)
    assert reread.applied is None and reread.status is None and "unsupported schema 2" in caplog.text

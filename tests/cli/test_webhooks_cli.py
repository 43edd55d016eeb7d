"""``edgectl webhook ...`` in its own processes on a SQLite store: one-line errors with nothing stored, the secret once."""

from __future__ import annotations

import json
from pathlib import Path

from edgectl.controller.store import SqliteStore
from tests.fleet import EdgectlHome


def test_webhook_commands(tmp_path: Path) -> None:
    home = EdgectlHome(tmp_path / "home", "mqtt://127.0.0.1:1")
    home.path.mkdir()
    bad = home.edgectl("webhook", "add", "ftp://hooks.example.com/edge")
    assert (bad.returncode, bad.stderr) == (2, "error: url: ftp scheme: use http:// or https://\n")
    bad = home.edgectl("webhook", "add", "https://hooks.example.com/edge", "--event", "rollout.*", "--event", "rollout.gone")
    assert bad.returncode == 2 and bad.stderr.startswith("error: events[1]: 'rollout.gone' matches no event type")
    assert SqliteStore(home.path / "controller.db").webhooks() == [], "a refused webhook was stored"

    added = json.loads(home.edgectl("webhook", "add", "https://hooks.example.com/edge", "-e", "rollout.*", "--json",
                                    check=True).stdout)
    secret = added["secret"]
    listed = home.edgectl("webhook", "list", "--json", check=True).stdout
    assert [(w["id"], w["secret_hint"]) for w in json.loads(listed)] == [(added["id"], "…" + secret[-4:])]
    assert secret not in listed
    store = SqliteStore(home.path / "controller.db")
    assert [a.actor.startswith("cli:") for a in store.audit_log() if a.action.startswith("webhook")] == [True]

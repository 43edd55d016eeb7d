"""``edgectl sso check`` against the real provider: the user and role a token signs in as, or one line saying why not."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.checkout import checkout_env
from tests.sso.conftest import CLIENT_ID, ROLE_MAP, OidcProvider


def edgectl(folder: Path, *args: str, stdin: str = "") -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "edgectl.cli.main", *args], cwd=folder, input=stdin, text=True,
                          capture_output=True, timeout=120, env=checkout_env(EDGECTL_HOME=str(folder / "home")))


@pytest.fixture(scope="module")
def folder(provider: OidcProvider, tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("sso-cli")
    oidc = {"issuer": provider.issuer, "client_id": CLIENT_ID, "role_map": ROLE_MAP, "ca_file": str(provider.ca)}
    (path / "edgectl.yaml").write_text(json.dumps({"api": {"oidc": oidc}}))
    return path


def test_a_good_token_names_the_user_and_role(provider: OidcProvider, folder: Path) -> None:
    token = provider.sign(provider.claims("alice"))
    done = edgectl(folder, "sso", "check", token)
    assert done.returncode == 0, done.stderr
    assert "oidc:alice signs in as operator" in done.stdout
    as_json = edgectl(folder, "sso", "check", "--json", stdin=token + "\n")
    assert as_json.returncode == 0, as_json.stderr
    assert json.loads(as_json.stdout)["role"] == "operator"


def test_a_refused_token_is_one_line_saying_why(provider: OidcProvider, folder: Path) -> None:
    now = int(time.time())
    done = edgectl(folder, "sso", "check", provider.sign(provider.claims("alice", iat=now - 7200, exp=now - 3600)))
    assert done.returncode == 3  # a VerificationError
    assert "token refused: expired" in done.stderr and len(done.stderr.strip().splitlines()) == 1, done.stderr
    no_role = edgectl(folder, "sso", "check", provider.sign(provider.claims("nora")))
    assert no_role.returncode == 3 and "oidc:nora has no edgectl role" in no_role.stderr


def test_without_a_provider_it_says_sso_is_off(tmp_path: Path) -> None:
    done = edgectl(tmp_path, "sso", "check", "a.b.c")
    assert done.returncode == 2 and "single sign-on is off" in done.stderr, done.stderr


def test_an_unreachable_provider_exits_5_saying_so(provider: OidcProvider, tmp_path: Path) -> None:
    oidc = {"issuer": provider.issuer, "client_id": CLIENT_ID, "role_map": ROLE_MAP}  # no ca_file: its certificate fails
    (tmp_path / "edgectl.yaml").write_text(json.dumps({"api": {"oidc": oidc}}))
    done = edgectl(tmp_path, "sso", "check", provider.sign(provider.claims("alice")))
    assert done.returncode == 5 and "provider cannot be used" in done.stderr, done.stderr

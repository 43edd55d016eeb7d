"""The provider's keys as the controller reads them: discovery with an exact issuer, the JWKS cached, fetched again on
an unknown kid at most once every REFETCH_S (the clock is a seam), and a key rotation picked up; the settings checked."""

from __future__ import annotations

from pathlib import Path

import jwt
import pytest

from edgecore.errors import ConfigError
from edgectl.api.oidc import REFETCH_S, Provider, Sso, sso_from_settings
from edgectl.api.router import ApiError
from edgectl.config import load_edgectl_config
from tests.checkout import REPO
from tests.docs.blocks import blocks
from tests.sso.conftest import OidcProvider


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_a_rotated_key_is_fetched_once_the_refetch_interval_has_passed(provider: OidcProvider) -> None:
    clock = Clock()
    sso = Sso(provider.settings(), Provider(provider.issuer, provider.ca, clock))
    assert sso.principal(sso.verify(provider.sign(provider.claims()))).user == "oidc:alice"
    provider.rotate("key-rotated")
    rotated = provider.sign(provider.claims(), kid="key-rotated")
    with pytest.raises(ApiError, match="unknown key id 'key-rotated'"):  # within the interval: no second fetch
        sso.verify(rotated)
    clock.now += REFETCH_S
    assert sso.principal(sso.verify(rotated)).role.value == "operator"
    assert sso.verify(provider.sign(provider.claims(), kid="key-1"))  # the old key is still published
    without_kid = jwt.encode(provider.claims(), provider.keys["key-1"], algorithm="RS256")
    with pytest.raises(ApiError, match="no key id"):  # two keys now: which one is not guessed
        sso.verify(without_kid)


def test_the_discovery_document_must_name_the_configured_issuer_exactly(provider: OidcProvider) -> None:
    sso = Sso(provider.settings(issuer=provider.issuer + "/"), Provider(provider.issuer + "/", provider.ca))
    with pytest.raises(ApiError, match=r"not api\.oidc\.issuer") as caught:
        sso.verify(provider.sign(provider.claims()))
    assert caught.value.status == 503


def test_an_unreachable_provider_is_a_503_that_says_so(provider: OidcProvider) -> None:
    sso = Sso(provider.settings(), Provider(provider.issuer))  # without the test CA: its certificate is not trusted
    with pytest.raises(ApiError, match="cannot be used") as caught:
        sso.verify(provider.sign(provider.claims()))
    assert caught.value.status == 503


@pytest.mark.parametrize("changes, message", [
    ({"issuer": "http://idp.example"}, "api.oidc.issuer"),
    ({"client_id": ""}, "api.oidc.client_id"),
    ({"role_map": {"admins": "root"}}, "api.oidc.role_map 'admins'"),
    ({"role_map": {}}, "api.oidc.role_map"),
    ({"leeway_s": -1.0}, "api.oidc.leeway_s"),
    ({"ca_file": Path("/nonexistent/ca.pem")}, "api.oidc.ca_file"),
])
def test_a_wrong_setting_is_a_config_error_naming_the_key(provider: OidcProvider, changes: dict[str, object],
                                                          message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        sso_from_settings(provider.settings(**changes))


def test_sso_is_off_without_an_issuer(provider: OidcProvider) -> None:
    assert sso_from_settings(provider.settings(issuer="")) is None


def test_the_examples_in_docs_sso_md_load_and_are_valid(tmp_path: Path) -> None:
    examples = [b for b in blocks(REPO / "docs" / "sso.md") if b.language == "yaml"]
    assert len(examples) == 2
    for i, block in enumerate(examples):
        path = tmp_path / f"edgectl-{i}.yaml"
        path.write_text("\n".join(block.body))
        settings = load_edgectl_config(path).api.oidc
        assert sso_from_settings(settings) is not None, block.where
        assert settings.role_map and set(settings.role_map.values()) == {"viewer", "operator", "admin"}

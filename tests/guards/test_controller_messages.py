"""What a device takes from its controller, field by field: each limit at its edge, the artifact URLs and the
options a device acts on, refused whole when one entry is wrong."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from edgecore.errors import ProtocolError
from edgecore.protocol.envelope import MANIFEST_TYPE, sign
from edgecore.protocol.messages import MAX_ARTIFACT_URLS, Command, DesiredModel, DesiredState
from edgectl.package import Package
from tests.guards.rollout_bench import signed_package


@pytest.fixture(scope="module")
def package(tmp_path_factory: pytest.TempPathFactory) -> Package:
    return signed_package(tmp_path_factory.mktemp("pkg"))


def desired(package: Package, **model: Any) -> dict[str, Any]:
    urls = model.pop("urls", ())
    state = DesiredState("dev-1", 7, 1.0, 2.0, "d-1", DesiredModel("clf", 2, package.envelope, tuple(urls)), {})
    data: dict[str, Any] = json.loads(state.to_payload())
    data["model"].update(model)
    return data


def read(data: dict[str, Any]) -> DesiredState:
    return DesiredState.from_payload(json.dumps(data).encode())


def test_a_desired_state_reads_back_what_was_sent(package: Package) -> None:
    state = read(desired(package, urls=["https://cdn.example/a"]))
    assert state.model is not None and (state.model.name, state.model.version) == ("clf", 2)
    assert state.model.urls == ("https://cdn.example/a",) and state.model.manifest.payload_type == MANIFEST_TYPE
    assert (state.device_id, state.seq, state.deployment_id) == ("dev-1", 7, "d-1")
    assert read({**desired(package), "model": None}).model is None


EDGES: list[tuple[str, Callable[[dict[str, Any], int], None], int, int]] = [  # what, put n, the last accepted, the first refused
    ("model.name", lambda d, n: d["model"].update(name="n" * n), 128, 129),
    ("model.version", lambda d, n: d["model"].update(version=n), 1, 0),
    ("seq", lambda d, n: d.update(seq=n), 1, 0),
    ("model.urls", lambda d, n: d["model"].update(urls=[f"https://h/{i}" for i in range(n)]), MAX_ARTIFACT_URLS,
     MAX_ARTIFACT_URLS + 1),
    ("a URL's length", lambda d, n: d["model"].update(urls=["https://h/" + "a" * (n - 10)]), 4096, 4097),
]


@pytest.mark.parametrize(("what", "put", "last", "first"), EDGES, ids=[e[0] for e in EDGES])
def test_each_limit_of_a_desired_state_at_its_edge(package: Package, what: str, put: Callable[[dict[str, Any], int], None],
                                                   last: int, first: int) -> None:
    accepted, refused = desired(package), desired(package)
    put(accepted, last)
    put(refused, first)
    read(accepted)
    with pytest.raises(ProtocolError):
        read(refused)


@pytest.mark.parametrize("url", ["ftp://h/a", "//h/a", "h/a", "https://h/a b", "https://h/a\tb", "https://h/\x01",
                                 "https://h/\x1f", "https://h/\x7f", "https://h/a\n", 7, None])
def test_one_bad_url_refuses_the_whole_desired_state(package: Package, url: object) -> None:
    with pytest.raises(ProtocolError, match="urls"):
        read(desired(package, urls=["https://good/a", url]))


@pytest.mark.parametrize("url", ["http://h/a", "https://h:8443/a?x-amz-signature=1&b=%20", "https://h/\x80"])
def test_http_and_https_urls_are_taken(package: Package, url: str) -> None:
    state = read(desired(package, urls=[url]))
    assert state.model is not None and state.model.urls == (url,)


@pytest.mark.parametrize(("options", "shadow_min"), [({}, None), ({"shadow": {"min_agreement": 0}}, 0.0),
                                                     ({"shadow": {"min_agreement": 1}}, 1.0),
                                                     ({"shadow": {"min_agreement": 0.5}, "allow_downgrade": True}, 0.5)])
def test_options_a_device_acts_on_are_read(package: Package, options: dict[str, Any], shadow_min: float | None) -> None:
    assert read({**desired(package), "options": options}).shadow_min == shadow_min


@pytest.mark.parametrize("shadow", [{"min_agreement": -0.01}, {"min_agreement": 1.01}, {"min_agreement": True},
                                    {"min_agreement": "0.9"}, {}, [0.9], 0.9])
def test_a_malformed_shadow_option_is_refused(package: Package, shadow: object) -> None:
    with pytest.raises(ProtocolError, match=r"options\.shadow"):
        read({**desired(package), "options": {"shadow": shadow}})


def test_a_command_reads_back_and_starts_at_seq_1() -> None:
    command = Command.from_payload(Command("dev-1", 1, 1.0, 2.0, "rollback", {"deployment_id": "d-1"}).to_payload())
    assert (command.seq, command.command, command.args) == (1, "rollback", {"deployment_id": "d-1"})
    assert Command.from_payload(Command("dev-1", 2, 1.0, 2.0, "report").to_payload()).args == {}
    with pytest.raises(ProtocolError, match="seq"):
        Command.from_payload(Command("dev-1", 0, 1.0, 2.0, "report").to_payload())
    with pytest.raises(ProtocolError, match="unknown command 'reboot'"):
        Command.from_payload(Command("dev-1", 1, 1.0, 2.0, "reboot").to_payload())


def test_a_desired_state_whose_manifest_is_not_an_envelope_is_refused(package: Package) -> None:
    data = desired(package)
    data["model"]["manifest"] = {"payloadType": MANIFEST_TYPE}
    with pytest.raises(ProtocolError, match="envelope: missing field 'payload'"):
        read(data)
    data["model"]["manifest"] = sign(MANIFEST_TYPE, b"{}", Ed25519PrivateKey.generate()).to_json()
    assert read(data).model is not None

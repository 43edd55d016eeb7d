"""The REST API's own limits: where it may listen without TLS, and the bodies it refuses before reading them."""

from __future__ import annotations

import http.client
import json
import logging
import ssl
from collections.abc import Iterator
from pathlib import Path

import pytest

from edgecore.errors import ConfigError
from edgectl.api.accounts import Accounts
from edgectl.api.app import api_context, api_routes
from edgectl.api.server import MAX_JSON_BYTES, ApiServer, check_exposure, parse_listen
from edgectl.config import ApiSettings, EdgectlConfig
from edgectl.controller.accounts import Role
from edgectl.controller.store import SqliteStore
from edgectl.keys import Keyring


@pytest.mark.parametrize(("text", "address"), [("127.0.0.1:8470", ("127.0.0.1", 8470)), ("[::1]:0", ("::1", 0)),
                                                ("localhost:65535", ("localhost", 65535)), ("0.0.0.0:1", ("0.0.0.0", 1))])
def test_listen_addresses_are_read(text: str, address: tuple[str, int]) -> None:
    assert parse_listen(text) == address


@pytest.mark.parametrize("text", ["8470", ":8470", "host:", "host:65536", "host:-1", "host:http", "[]:80"])
def test_bad_listen_addresses_are_refused(text: str) -> None:
    with pytest.raises(ConfigError, match="expected HOST:PORT"):
        parse_listen(text)


@pytest.fixture
def operator(tmp_path: Path) -> Iterator[tuple[ApiServer, str]]:
    store = SqliteStore(tmp_path / "store.db")
    ctx = api_context(store, EdgectlConfig(api=ApiSettings(max_upload_mb=1)), keyring=Keyring(tmp_path / "keys"))
    accounts = Accounts(store)
    accounts.add_user("ops", Role.OPERATOR, "test")
    server = ApiServer(ctx, api_routes(ctx), "127.0.0.1", 0).start()
    yield server, accounts.create_token("ops", "", None, "test")[1]
    server.stop()
    store.close()


def _post(server: ApiServer, token: str, path: str, headers: dict[str, str], body: bytes = b"") -> tuple[int, str]:
    port = server.port
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    conn.putrequest("POST", path)
    for key, value in {"Authorization": f"Bearer {token}", **headers}.items():
        conn.putheader(key, value)
    conn.endheaders()
    if body:
        conn.send(body)
    answer = conn.getresponse()
    message = json.loads(answer.read())["error"]["message"]
    conn.close()
    return answer.status, message


def test_bodies_are_refused_by_their_declared_size(operator: tuple[ApiServer, str]) -> None:
    server, token = operator
    status, message = _post(server, token, "/api/v1/rollouts", {"Content-Length": str(MAX_JSON_BYTES + 1)})
    assert (status, message) == (413, f"the body is {MAX_JSON_BYTES + 1} bytes, over the limit of {MAX_JSON_BYTES}")
    status, _ = _post(server, token, "/api/v1/rollouts", {"Content-Length": "2"}, b"{}")
    assert status == 400  # within the limit: read, then refused for what it says
    status, message = _post(server, token, "/api/v1/packages", {"Content-Length": str((1 << 20) + 1)})
    assert (status, message) == (413, f"the body is {(1 << 20) + 1} bytes, over the limit of {1 << 20}")
    assert _post(server, token, "/api/v1/rollouts", {"Transfer-Encoding": "chunked"})[0] == 411
    status, message = _post(server, token, "/api/v1/rollouts", {"Content-Length": "12x"})
    assert (status, message) == (400, "malformed request: Invalid character in Content-Length")


def test_off_loopback_the_api_needs_tls_unless_told_otherwise(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    for host in ("0.0.0.0", "192.0.2.7", "::", "example.org"):
        with pytest.raises(ConfigError, match=f"api.listen {host}:8470 is not loopback and has no TLS"):
            check_exposure(host, 8470, None, False)
    tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    with caplog.at_level(logging.WARNING, logger="edgectl.api.server"):
        for host, context, insecure in (("127.0.0.1", None, False), ("::1", None, False), ("localhost", None, False),
                                        ("0.0.0.0", tls, False), ("0.0.0.0", tls, True)):
            check_exposure(host, 8470, context, insecure)
        assert caplog.records == []
        check_exposure("0.0.0.0", 8470, None, True)  # on purpose: allowed, and said
    assert [r.getMessage() for r in caplog.records] == [
        "REST API on 0.0.0.0:8470 without TLS (api.insecure: true): tokens travel in clear text"]
    store = SqliteStore(tmp_path / "store.db")
    ctx = api_context(store, EdgectlConfig(), keyring=Keyring(tmp_path / "keys"))
    with pytest.raises(ConfigError, match="is not loopback and has no TLS"):
        ApiServer(ctx, api_routes(ctx), "0.0.0.0", 0)  # the server checks before it binds
    store.close()


def test_the_document_and_the_metrics_answer_200(operator: tuple[ApiServer, str]) -> None:
    server, token = operator
    for path in ("/api/v1/openapi.json", "/metrics", "/api/v1/health"):
        conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
        conn.request("GET", path, headers={"Authorization": f"Bearer {token}"})
        assert conn.getresponse().status == 200, path
        conn.close()


def test_a_body_exactly_at_the_limit_is_read(operator: tuple[ApiServer, str]) -> None:
    server, token = operator
    body = b'{"packages": []' + b" " * (MAX_JSON_BYTES - 16) + b"}"
    assert len(body) == MAX_JSON_BYTES
    status, message = _post(server, token, "/api/v1/rollouts", {"Content-Length": str(MAX_JSON_BYTES)}, body)
    assert status == 400 and "over the limit" not in message  # read, then refused for what it says

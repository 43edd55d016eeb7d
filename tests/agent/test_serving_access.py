"""Who may call the inference API: loopback by default; off loopback a bearer token or mutual TLS."""

from __future__ import annotations

import http.client
import ssl
from pathlib import Path

import pytest

from agent.config import InferenceSettings
from agent.serving import InferenceServer, ModelRegistry
from agent.serving.access import TlsFiles
from edgecore.errors import ConfigError
from edgectl.pki import Algorithm, FleetPki
from edgectl.pki.certs import Usage


def test_off_loopback_without_auth_refuses_to_start() -> None:
    with pytest.raises(ConfigError, match=r"inference.host 0.0.0.0 is not loopback and nothing authenticates clients"):
        InferenceServer(ModelRegistry(), host="0.0.0.0")
    server = InferenceServer(ModelRegistry(), host="0.0.0.0", insecure=True)  # the operator said so
    server.stop()


def test_settings_with_a_short_token_name_the_key(tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text("short\n")
    with pytest.raises(ConfigError, match=r"inference.token_file: .* holds 5 characters"):
        InferenceServer.from_settings(ModelRegistry(), InferenceSettings(host="0.0.0.0", port=0, token_file=token))


def get(port: int, path: str, headers: dict[str, str] | None = None, context: ssl.SSLContext | None = None) -> int:
    conn = (http.client.HTTPSConnection("127.0.0.1", port, context=context, timeout=10) if context
            else http.client.HTTPConnection("127.0.0.1", port, timeout=10))
    conn.request("GET", path, headers=headers or {})
    response = conn.getresponse()
    response.read()
    conn.close()
    return response.status


def test_bearer_token_guards_everything_but_health(tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text("s3cret-token-0123456789\n")
    token.chmod(0o600)
    server = InferenceServer.from_settings(ModelRegistry(), InferenceSettings(host="0.0.0.0", port=0, token_file=token,
                                                                              memory_limit_mb=0))
    server.start()
    try:
        assert get(server.port, "/v2") == 401
        assert get(server.port, "/v2", {"Authorization": "Bearer wrong-token-0123456789"}) == 401
        assert get(server.port, "/v2", {"Authorization": "Bearer s3cret-token-0123456789"}) == 200
        assert get(server.port, "/metrics", {"Authorization": "Bearer s3cret-token-0123456789"}) == 200
        assert get(server.port, "/v2/health/live") == 200
    finally:
        server.stop()


def test_mutual_tls_needs_a_client_certificate_from_the_ca(tmp_path: Path) -> None:
    pki = FleetPki.init(tmp_path / "pki", Algorithm.P256)
    files = {}
    for name, usage, hosts in (("server", Usage.SERVER, ["127.0.0.1"]), ("client", Usage.CLIENT, [])):
        identity = pki.issue(name, usage, 1, hosts)
        files[name] = (tmp_path / f"{name}.pem", tmp_path / f"{name}.key")
        files[name][0].write_bytes(identity.cert_pem)
        files[name][1].write_bytes(identity.key_pem)
    tls = TlsFiles(*files["server"], pki.ca_cert_path)
    server = InferenceServer(ModelRegistry(), host="0.0.0.0", tls=tls)  # mutual TLS counts as authentication
    server.start()
    try:
        anonymous = ssl.create_default_context(cafile=str(pki.ca_cert_path))
        with pytest.raises((ssl.SSLError, ConnectionError, OSError)):
            get(server.port, "/v2", context=anonymous)
        client = ssl.create_default_context(cafile=str(pki.ca_cert_path))
        client.load_cert_chain(*map(str, files["client"]))
        assert get(server.port, "/v2", context=client) == 200
        assert server.url.startswith("https://")
    finally:
        server.stop()

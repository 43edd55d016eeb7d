"""TLS when configured, and no listening off loopback without TLS unless ``api.insecure: true``."""

from __future__ import annotations

import datetime
import json
import ssl
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

import pytest
import yaml
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from edgecore.errors import ConfigError
from edgectl.api import ApiServer, api_context, api_routes
from edgectl.api.server import server_tls
from edgectl.config import EdgectlConfig
from edgectl.controller.store import SqliteStore
from tests.brokers import free_port
from tests.checkout import checkout_env


def _self_signed(folder: Path) -> tuple[Path, Path]:
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName([x509.DNSName("localhost")]), critical=False)
            .sign(key, hashes.SHA256()))
    cert_path, key_path = folder / "api.crt", folder / "api.key"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    return cert_path, key_path


def test_off_loopback_needs_tls_or_insecure(tmp_path: Path) -> None:
    ctx = api_context(SqliteStore(tmp_path / "c.db"), EdgectlConfig())
    with pytest.raises(ConfigError, match="not loopback and has no TLS"):
        ApiServer(ctx, api_routes(ctx), "0.0.0.0", 0)
    ApiServer(ctx, api_routes(ctx), "0.0.0.0", 0, insecure=True).stop()
    cert, key = _self_signed(tmp_path)
    ApiServer(ctx, api_routes(ctx), "0.0.0.0", 0, tls=server_tls(cert, key)).stop()
    with pytest.raises(ConfigError, match="go together"):
        server_tls(cert, None)


def test_tls_serves_https_only(tmp_path: Path) -> None:
    cert, key = _self_signed(tmp_path)
    ctx = api_context(SqliteStore(tmp_path / "c.db"), EdgectlConfig())
    server = ApiServer(ctx, api_routes(ctx), "127.0.0.1", 0, tls=server_tls(cert, key)).start()
    try:
        assert server.url.startswith("https://")
        client = ssl.create_default_context(cafile=str(cert))
        port = server.url.rsplit(":", 1)[1]
        with urllib.request.urlopen(f"https://localhost:{port}/api/v1/health", context=client, timeout=10) as answer:
            assert json.loads(answer.read()) == {"status": "ok"}
        with pytest.raises(urllib.error.URLError):  # an unknown certificate is refused by a checking client
            urllib.request.urlopen(f"https://localhost:{port}/api/v1/health", timeout=10)
        with pytest.raises((urllib.error.URLError, ConnectionError)):  # plain HTTP gets no answer
            urllib.request.urlopen(f"http://127.0.0.1:{port}/api/v1/health", timeout=10)
    finally:
        server.stop()


def test_cli_refuses_off_loopback_in_one_line(tmp_path: Path) -> None:
    (tmp_path / "edgectl.yaml").write_text(yaml.safe_dump({"controller": {"store": str(tmp_path / "c.db")}}))
    result = subprocess.run([sys.executable, "-m", "edgectl.cli.main", "api", "serve", "--http", f"0.0.0.0:{free_port()}"],
                            cwd=tmp_path, env=checkout_env(EDGECTL_HOME=str(tmp_path / "home")), capture_output=True,
                            text=True, timeout=60)
    assert result.returncode == 2, result.stderr
    assert result.stderr.strip().count("\n") == 0 and "api.insecure: true" in result.stderr

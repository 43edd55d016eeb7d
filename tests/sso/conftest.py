"""A real OpenID Connect provider (tests/sso/provider.py, pyop) in its own process, and the REST API trusting it.

:class:`OidcProvider` starts the provider on a free port with RSA keys made here (so a test can also sign tokens of
its choosing with the provider's own key, or with another), rotates its keys by rewriting its key file, and runs the
authorization code flow with PKCE over plain HTTP as a browser would. ``sso_api`` is the API server on a SQLite
store with ``api.oidc`` pointing at the provider.
"""

from __future__ import annotations

import base64
import datetime
import hashlib
import ipaddress
import json
import secrets
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jwt
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from cryptography.x509.oid import NameOID

from edgectl.api.app import api_context, api_routes
from edgectl.api.server import ApiServer
from edgectl.config import ApiSettings, EdgectlConfig, OidcSettings
from edgectl.controller.store import open_url
from tests.brokers import free_port, wait_port
from tests.checkout import checkout_env

CLIENT_ID = "edgectl-console"
CLIENT_SECRET = "test-secret-" + "x" * 20
ROLE_MAP = {"fleet-admins": "admin", "fleet-operators": "operator", "fleet-viewers": "viewer"}
USERS = {"alice": {"password": "alice-pw", "roles": ["fleet-operators", "unrelated"], "email": "alice@example.org"},
         "victor": {"password": "victor-pw", "roles": ["fleet-viewers"]},
         "nora": {"password": "nora-pw", "roles": ["nobody-maps-this"]}}


@dataclass
class Answer:
    status: int
    body: Any
    headers: dict[str, str]


def call(url: str, method: str = "GET", token: str | None = None, body: Any = None) -> Answer:
    """One JSON request; any status comes back as an Answer."""
    headers = {"Content-Type": "application/json", **({"Authorization": f"Bearer {token}"} if token else {})}
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(url, data, headers, method=method)
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return Answer(response.status, json.loads(response.read() or b"null"), dict(response.headers))
    except urllib.error.HTTPError as exc:
        return Answer(exc.code, json.loads(exc.read() or b"null"), dict(exc.headers))


def _pem(key: rsa.RSAPrivateKey) -> str:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption()).decode()


def rsa_pem() -> str:
    return _pem(rsa.generate_private_key(public_exponent=65537, key_size=2048))


def tls_files(folder: Path) -> tuple[Path, Path, Path]:
    """A test CA and a server certificate for 127.0.0.1 that it signed: (ca.pem, cert.pem, key.pem)."""
    now = datetime.datetime.now(datetime.timezone.utc)
    ca_key, key = rsa.generate_private_key(public_exponent=65537, key_size=2048), rsa.generate_private_key(
        public_exponent=65537, key_size=2048)
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "sso test CA")])
    ca = (x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name).public_key(ca_key.public_key())
          .serial_number(x509.random_serial_number()).not_valid_before(now).not_valid_after(now + datetime.timedelta(days=1))
          .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True).sign(ca_key, hashes.SHA256()))
    cert = (x509.CertificateBuilder().subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")]))
            .issuer_name(ca_name).public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now).not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), critical=False)
            .sign(ca_key, hashes.SHA256()))
    paths = folder / "ca.pem", folder / "cert.pem", folder / "key.pem"
    paths[0].write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    paths[1].write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    paths[2].write_text(_pem(key))
    return paths


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args: Any) -> None:
        return None


@dataclass
class OidcProvider:
    """The provider process; ``keys`` is its key file's content (kid -> private PEM, the first signs)."""

    root: Path
    redirect_uris: list[str]
    port: int = 0
    keys: dict[str, str] = field(default_factory=dict)
    process: subprocess.Popen[bytes] | None = None

    @property
    def issuer(self) -> str:
        return f"https://127.0.0.1:{self.port}"

    @property
    def ca(self) -> Path:
        return self.root / "ca.pem"

    def tls(self) -> ssl.SSLContext:
        return ssl.create_default_context(cafile=str(self.ca))

    def __post_init__(self) -> None:
        """Its keys, test CA and certificate, and port, chosen before it starts (the controller's settings name them)."""
        self.root.mkdir(parents=True, exist_ok=True)
        self.keys = {"key-1": rsa_pem()}
        self._write_keys()
        tls_files(self.root)
        (self.root / "users.json").write_text(json.dumps(USERS))
        self.port = self.port or free_port()

    def start(self) -> OidcProvider:
        args = ["--port", str(self.port), "--cert", str(self.root / "cert.pem"), "--key", str(self.root / "key.pem"),
                "--keys", str(self.root / "keys.json"), "--users", str(self.root / "users.json"),
                "--client", CLIENT_ID, "--secret", CLIENT_SECRET]
        for uri in self.redirect_uris:
            args += ["--redirect", uri]
        with (self.root / "provider.log").open("ab") as out:
            self.process = subprocess.Popen([sys.executable, "-m", "tests.sso.provider", *args], env=checkout_env(),
                                            stdout=out, stderr=subprocess.STDOUT)
        wait_port(self.port, 60)
        return self

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            self.process.wait(20)

    def _write_keys(self) -> None:
        (self.root / "keys.json").write_text(json.dumps([{"kid": k, "pem": p} for k, p in self.keys.items()]))

    def rotate(self, kid: str) -> None:
        """A new signing key ``kid`` first in the file (the old ones stay published)."""
        self.keys = {kid: rsa_pem(), **self.keys}
        self._write_keys()

    def settings(self, **changes: Any) -> OidcSettings:
        values: dict[str, Any] = {"issuer": self.issuer, "client_id": CLIENT_ID, "client_secret": CLIENT_SECRET,
                                  "roles_claim": "roles", "role_map": ROLE_MAP, "leeway_s": 30.0, "ca_file": self.ca,
                                  **changes}
        return OidcSettings(**values)

    def claims(self, user: str = "alice", lifetime_s: float = 600, **changes: Any) -> dict[str, Any]:
        now = int(time.time())
        return {"iss": self.issuer, "aud": CLIENT_ID, "sub": f"sub-{user}", "preferred_username": user,
                "roles": USERS[user]["roles"], "iat": now, "exp": now + int(lifetime_s), **changes}

    def sign(self, claims: dict[str, Any], kid: str = "key-1", key: str | None = None, alg: str = "RS256") -> str:
        """A JWT over ``claims``, signed with the provider's key ``kid`` (or ``key``, a PEM or secret, instead)."""
        return jwt.encode(claims, key if key is not None else self.keys[kid], algorithm=alg, headers={"kid": kid})

    def code_flow(self, user: str, redirect_uri: str, challenge_method: str = "S256") -> dict[str, str]:
        """Log ``user`` in at the provider as a browser would: {code, code_verifier, nonce, state, redirect_uri}."""
        verifier, nonce, state = secrets.token_urlsafe(48), secrets.token_urlsafe(16), secrets.token_urlsafe(16)
        challenge = base64.urlsafe_b64encode(hashlib.sha256(verifier.encode()).digest()).rstrip(b"=").decode()
        query = urllib.parse.urlencode({"response_type": "code", "client_id": CLIENT_ID, "redirect_uri": redirect_uri,
                                        "scope": "openid profile", "state": state, "nonce": nonce,
                                        "code_challenge": challenge, "code_challenge_method": challenge_method})
        with urllib.request.urlopen(f"{self.issuer}/authorize?{query}", timeout=30, context=self.tls()) as page:
            assert page.status == 200
        form = urllib.parse.urlencode({"request": query, "username": user, "password": USERS[user]["password"]}).encode()
        opener = urllib.request.build_opener(_NoRedirect, urllib.request.HTTPSHandler(context=self.tls()))
        try:
            opener.open(f"{self.issuer}/authorize", form, timeout=30)
            raise AssertionError("the provider did not redirect back")
        except urllib.error.HTTPError as exc:
            location = exc.headers["Location"]
        back = urllib.parse.parse_qs(urllib.parse.urlsplit(location).query)
        assert back["state"] == [state], location
        return {"code": back["code"][0], "code_verifier": verifier, "nonce": nonce, "redirect_uri": redirect_uri}


@pytest.fixture(scope="module")
def provider(tmp_path_factory: pytest.TempPathFactory) -> Iterator[OidcProvider]:
    started = OidcProvider(tmp_path_factory.mktemp("oidc"), ["http://127.0.0.1/console/"]).start()
    try:
        yield started
    finally:
        started.stop()


@dataclass
class SsoApi:
    url: str
    server: ApiServer

    def call(self, method: str, path: str, token: str | None = None, body: Any = None) -> Answer:
        return call(f"{self.url}{path}", method, token, body)


@pytest.fixture(scope="module")
def sso_api(provider: OidcProvider, tmp_path_factory: pytest.TempPathFactory) -> Iterator[SsoApi]:
    store = open_url(str(tmp_path_factory.mktemp("store") / "controller.db"))
    ctx = api_context(store, EdgectlConfig(api=ApiSettings(oidc=provider.settings())))
    server = ApiServer(ctx, api_routes(ctx), "127.0.0.1", free_port()).start()
    try:
        yield SsoApi(server.url, server)
    finally:
        server.stop()

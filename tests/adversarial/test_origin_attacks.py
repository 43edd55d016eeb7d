"""``edgectl artifacts serve`` under hostile clients: silent TLS clients, idle floods, absurd Range numbers.

Issue 27 found that with TLS one client that connects and says nothing blocked every other client
(the handshake ran in the accept loop, without a timeout); that 1,026 idle plain connections took
every descriptor while accept() spun on EMFILE; and that Range positions of thousands of digits
got no answer at all. Each case runs the real command in its own process, with a descriptor
limit of 256 where descriptors are the point.
"""

from __future__ import annotations

import http.client
import re
import resource
import ssl
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from edgectl.pki.authority import FleetPki
from edgectl.pki.certs import Algorithm, Usage
from tests.adversarial.hostile import closed_within, slow_clients, still_open
from tests.checkout import checkout_env

SIZE = 100_000
NOFILE = 256


def _low_nofile() -> None:
    resource.setrlimit(resource.RLIMIT_NOFILE, (NOFILE, NOFILE))


@pytest.fixture
def served(tmp_path: Path) -> Path:
    root = tmp_path / "served"
    root.mkdir()
    (root / "payload").write_bytes(bytes(range(256)) * (SIZE // 256) + bytes(SIZE % 256))
    return root


@pytest.fixture
def origin(tmp_path: Path) -> Iterator[Callable[..., str]]:
    """Factory: origin(directory, *args) runs ``edgectl artifacts serve`` under a 256-descriptor limit; its URL."""
    started: list[subprocess.Popen[str]] = []

    def start(directory: Path, *args: str) -> str:
        process = subprocess.Popen([sys.executable, "-m", "edgectl.cli.main", "artifacts", "serve", str(directory),
                                    "--port", "0", *args], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                   env=checkout_env(PYTHONUNBUFFERED="1"), preexec_fn=_low_nofile)
        started.append(process)
        assert process.stdout is not None
        line = process.stdout.readline()
        match = re.search(r"on (https?://\S+?)/?$", line.strip())
        assert match, f"edgectl artifacts serve printed {line!r}"
        return match[1]

    yield start
    for process in started:
        process.terminate()
        process.wait(10)


def _get(url: str, range_header: str | None = None, context: ssl.SSLContext | None = None,
         source: str = "127.0.0.1") -> http.client.HTTPResponse:
    host, port = url.split("://")[1].rsplit(":", 1)
    conn: http.client.HTTPConnection = (
        http.client.HTTPSConnection(host, int(port), timeout=10, context=context, source_address=(source, 0))
        if context else http.client.HTTPConnection(host, int(port), timeout=10, source_address=(source, 0)))
    conn.request("GET", "/payload", headers={"Range": range_header} if range_header else {})
    return conn.getresponse()


def test_a_silent_tls_client_delays_no_other(served: Path, origin: Callable[..., str], tmp_path: Path) -> None:
    pki = FleetPki.init(tmp_path / "pki", Algorithm.P256)
    identity = pki.issue("artifacts", Usage.SERVER, 1, hosts=["127.0.0.1"])
    cert, key = tmp_path / "server.pem", tmp_path / "server.key"
    cert.write_bytes(identity.cert_pem)
    key.write_bytes(identity.key_pem)
    url = origin(served, "--tls-cert", str(cert), "--tls-key", str(key))
    context = ssl.create_default_context(cafile=str(pki.ca_cert_path))
    port = int(url.rsplit(":", 1)[1])
    with slow_clients(port, 5, line=b"", tls=True) as silent:  # connect, never start a handshake
        assert len(silent) == 5
        answer = _get(url, "bytes=0-9", context)
        assert (answer.status, answer.read()) == (206, bytes(range(10)))


def test_idle_connections_cannot_take_every_descriptor(served: Path, origin: Callable[..., str]) -> None:
    url = origin(served, "--max-per-address", "32", "--header-timeout", "2")
    port = int(url.rsplit(":", 1)[1])
    with slow_clients(port, NOFILE + 44, line=b"") as idle:  # more connections than the process has descriptors
        held = still_open(idle, 32)
        answer = _get(url, "bytes=0-9")  # another client is served meanwhile
        assert (answer.status, answer.read()) == (206, bytes(range(10)))
        assert all(closed_within(sock, 10) for sock in held), "idle connections outlived the header timeout"


HUGE = "9" * 5000  # past what int() converts (4,300 digits)
RANGES = [  # (Range header, status, Content-Range) as RFC 9110 14.1.1 and 15.5.17 say
    (f"bytes=0-{HUGE}", 206, f"bytes 0-{SIZE - 1}/{SIZE}"),
    (f"bytes={HUGE}-", 416, f"bytes */{SIZE}"),
    (f"bytes=-{HUGE}", 206, f"bytes 0-{SIZE - 1}/{SIZE}"),
    (f"bytes={'1' * 20}-{'2' * 20}", 416, f"bytes */{SIZE}"),
    (f"bytes=5-{'0' * 30}7", 206, f"bytes 5-7/{SIZE}"),
    (f"bytes={HUGE}-0", 200, None),  # the last position before the first: invalid, so ignored
]


def test_range_positions_of_any_length_are_answered(served: Path, origin: Callable[..., str]) -> None:
    url = origin(served)
    for header, status, content_range in RANGES:
        answer = _get(url, header)
        assert (answer.status, answer.getheader("Content-Range")) == (status, content_range), header[:40]
        answer.read()

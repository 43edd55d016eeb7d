"""The device's HTTP fetch against sources that steer or stall, in process (the real-agent cases: tests/adversarial).

Redirects go only to http(s), to a signed URL's origin or a host the operator allows, never to an
internal address unless allowed, and at most three hops; a response head, each chunk and the whole
download run under a watchdog that cuts the connection when its time is up.
"""

from __future__ import annotations

import hashlib
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from edgecore.delivery.download import Download
from edgecore.delivery.http_fetch import HttpFetch, HttpSettings
from edgecore.delivery.redirects import RedirectPolicy, RedirectRefused
from edgecore.delivery.watchdog import Watchdog
from edgecore.protocol.manifest import PayloadInfo
from edgectl.artifacts import RangeServer
from tests.adversarial.hostile import HostileOrigin, continue_forever, drip, redirect
from tests.fleet import wait_for

CHUNK = 4096
DATA = b"".join(hashlib.sha256(bytes([i % 256, i // 256])).digest() for i in range(1024))  # 32 KiB, 8 chunks
INFO = PayloadInfo(len(DATA), hashlib.sha256(DATA).hexdigest(), CHUNK,
                   tuple(hashlib.sha256(DATA[i:i + CHUNK]).hexdigest() for i in range(0, len(DATA), CHUNK)))
FAST = HttpSettings(timeout_s=0.5, min_bytes_per_s=64 * 1024)


@pytest.fixture
def honest(tmp_path: Path) -> Iterator[RangeServer]:
    root = tmp_path / "served"
    root.mkdir()
    (root / "payload").write_bytes(DATA)
    server = RangeServer(root).start()
    yield server
    server.stop()


def _fetch(tmp_path: Path, urls: list[str], settings: HttpSettings = FAST, deadline_s: float | None = None
           ) -> tuple[bool, HttpFetch, float]:
    fetch = HttpFetch(settings)
    download = Download(tmp_path / "dl", INFO, free_bytes=lambda _p: 10**12)
    started = time.monotonic()
    done = fetch.fetch(download, urls, None if deadline_s is None else started + deadline_s)
    download.close()
    return done, fetch, time.monotonic() - started


SIGNED = RedirectPolicy.for_urls(["https://cdn.example.org/a?sig=1", "http://10.0.0.5:8090/x"])


@pytest.mark.parametrize(("target", "why"), [
    ("gopher://cdn.example.org/x", "to a gopher: URL (only http and https are followed)"),
    ("file:///etc/passwd", "to a file: URL"),
    ("//cdn.example.org/x", "to a schemeless: URL"),
    ("http:///x", "to a URL without a host"),
    ("http://cdn.example.org/x", "to http://cdn.example.org:80, neither the origin of a signed URL"),  # https was signed
    ("https://cdn.example.org:8443/x", "to https://cdn.example.org:8443"),
    ("http://127.0.0.1:8090/admin", "to http://127.0.0.1:8090"),
    ("http://10.0.0.5:8091/x", "to http://10.0.0.5:8091"),
])
def test_a_redirect_off_the_signed_origins_is_refused(target: str, why: str) -> None:
    with pytest.raises(RedirectRefused, match=why.replace("(", r"\(").replace(")", r"\)")):
        SIGNED.check(target)


def test_a_redirect_to_a_signed_origin_goes_to_its_host_as_signed() -> None:
    assert SIGNED.check("HTTPS://CDN.example.org:443/b") is None
    assert SIGNED.check("http://10.0.0.5:8090/elsewhere?x=1") is None  # a signed origin is trusted, internal or not


def test_an_allowed_host_is_checked_for_internal_addresses_and_pinned() -> None:
    policy = RedirectPolicy.for_urls(["https://cdn.example.org/a"], hosts=["localhost", "*.example.net"])
    with pytest.raises(RedirectRefused, match=r"resolves to the internal address 127\.0\.0\.1"):
        policy.check("http://localhost:9/x")
    allowed = RedirectPolicy.for_urls(["https://cdn.example.org/a"], hosts=["localhost"], private=True)
    assert allowed.check("http://localhost:9/x") in ("127.0.0.1", "::1")
    for outside in ("http://example.net/x", "http://badexample.net/x", "http://localhost.evil.org/x"):
        with pytest.raises(RedirectRefused, match="neither the origin of a signed URL"):
            policy.check(outside)


def test_the_watchdog_cuts_only_what_outlives_its_time() -> None:
    fired = threading.Event()
    watchdog = Watchdog(fired.set)
    try:
        watchdog.arm(5.0, "slow")
        watchdog.arm(0.1, "cut")  # sooner: it wakes for it
        assert fired.wait(3) and watchdog.fired == "cut"
        fired.clear()
        watchdog.arm(0.2, "not this")
        watchdog.disarm()
        assert not fired.wait(0.5) and watchdog.fired is None
    finally:
        watchdog.close()


def test_drips_and_endless_100_continue_are_cut_and_said(tmp_path: Path, origins: Callable[..., HostileOrigin],
                                                         honest: RangeServer) -> None:
    dripping, continuing = origins(drip(DATA, 0.2)), origins(continue_forever(0.1))
    done, fetch, took = _fetch(tmp_path, [f"{dripping.url}/p", f"{continuing.url}/p", honest.url_of("payload")])
    assert done and took < 10
    assert fetch.failures == [f"{dripping.url}/p: stalled: chunk 0 (4096 bytes) took over 1 s (slower than 65536 B/s)",
                              f"{continuing.url}/p: stalled: no response head within 0.5 s"]


def test_redirects_lead_only_where_allowed_and_at_most_three_hops(tmp_path: Path, origins: Callable[..., HostileOrigin],
                                                                 honest: RangeServer) -> None:
    to_honest = origins(redirect(honest.url_of("payload").replace("127.0.0.1", "localhost")))
    done, fetch, _ = _fetch(tmp_path, [f"{to_honest.url}/p"])
    assert not done and "which resolves to the internal address" not in fetch.failures[0]
    assert "neither the origin of a signed URL nor a host in deploy.http_redirect_hosts" in fetch.failures[0]
    allowed = HttpSettings(timeout_s=2, redirect_hosts=("localhost",))
    done, fetch, _ = _fetch(tmp_path / "2", [f"{to_honest.url}/p"], allowed)
    assert not done and "resolves to the internal address" in fetch.failures[0]
    done, fetch, _ = _fetch(tmp_path / "3", [f"{to_honest.url}/p"], HttpSettings(timeout_s=2, redirect_hosts=("localhost",),
                                                                                   redirect_private=True))
    assert done and fetch.failures == []
    # Counted on the server's loop once its last sendfile returns: the client can hold every byte before that.
    wait_for(lambda: honest.bytes_sent == len(DATA), 10, "the range server to count what it sent")
    ring = [origins(redirect("/")), origins(redirect("/"))]  # two signed origins sending each other on, forever
    ring[0].behaviour, ring[1].behaviour = redirect(f"{ring[1].url}/p"), redirect(f"{ring[0].url}/p")
    done, fetch, _ = _fetch(tmp_path / "4", [f"{ring[0].url}/p", f"{ring[1].url}/p"], HttpSettings(timeout_s=2))
    assert not done and all(f.endswith("more than 3 redirects") for f in fetch.failures)
    assert len(ring[0].heads) + len(ring[1].heads) == 2 * 4  # per URL: the request and three hops


def test_the_download_deadline_ends_a_source_that_is_never_stalled(tmp_path: Path,
                                                                  origins: Callable[..., HostileOrigin]) -> None:
    slow = origins(drip(DATA, 0.05))  # 20 B/s: under no floor of 1 B/s
    done, fetch, took = _fetch(tmp_path, [f"{slow.url}/p", f"{slow.url}/q"], HttpSettings(timeout_s=2, min_bytes_per_s=1),
                               deadline_s=1.0)
    assert not done and took < 5
    assert fetch.failures == [f"{slow.url}/p: the download's deadline passed",
                              f"{slow.url}/q: not tried, the download's deadline passed"]

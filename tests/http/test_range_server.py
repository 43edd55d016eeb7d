"""The artifact Range server on a real socket: 206, 416, HEAD, keep-alive, and no way out of its directory."""

from __future__ import annotations

import http.client
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from edgectl.artifacts import RangeNotSatisfiable, RangeServer, parse_range
from tests.fleet import wait_for

DATA = bytes(range(256)) * 40  # 10240 bytes


@pytest.fixture
def served(tmp_path: Path) -> Iterator[RangeServer]:
    root = tmp_path / "root"
    root.mkdir()
    (root / "artifact").write_bytes(DATA)
    (root / "sub").mkdir()
    (root / "sub" / "a b").write_bytes(b"spaced")
    (tmp_path / "secret").write_bytes(b"SECRET")
    os.symlink(tmp_path / "secret", root / "link-out")
    server = RangeServer(root).start()
    yield server
    server.stop()


def _get(server: RangeServer, path: str, headers: dict[str, str] | None = None,
         method: str = "GET") -> tuple[int, dict[str, str], bytes]:
    host, port = server.url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=10)
    try:
        conn.request(method, path, headers=headers or {})
        response = conn.getresponse()
        return response.status, {k.lower(): v for k, v in response.getheaders()}, response.read()
    finally:
        conn.close()


@pytest.mark.parametrize(("header", "span"), [
    ("bytes=0-99", (0, 99)), ("bytes=100-", (100, 10239)), ("bytes=-10", (10230, 10239)),
    ("bytes=10000-99999", (10000, 10239)), (None, None), ("bytes=5-1", None), ("items=0-1", None),
    ("bytes=0-1,5-6", None), ("bytes=0-" + "9" * 5000, (0, 10239)), ("bytes=-" + "9" * 5000, (0, 10239)),
    ("bytes=00000000000000000000000010-000000000000000000000000012", (10, 12)), ("bytes=1-" + "0" * 40, None),
    ("bytes=" + "9" * 30 + "-0", None), ("bytes=10239-10239", (10239, 10239)), ("bytes=-10240", (0, 10239)),
    ("bytes=\u0661-2", None),
])
def test_parse_range(header: str | None, span: tuple[int, int] | None) -> None:
    assert parse_range(header, len(DATA)) == span


@pytest.mark.parametrize("header", ["bytes=10240-", "bytes=-0", "bytes=99999-100000", "bytes=" + "9" * 5000 + "-",
                                    "bytes=" + "1" * 20 + "-" + "2" * 20, "bytes=-" + "0" * 30])
def test_parse_range_unsatisfiable(header: str) -> None:
    with pytest.raises(RangeNotSatisfiable):
        parse_range(header, len(DATA))


def test_range_answers_206_with_content_range(served: RangeServer) -> None:
    status, headers, body = _get(served, "/artifact", {"Range": "bytes=1000-2999"})
    assert status == 206
    assert headers["content-range"] == "bytes 1000-2999/10240"
    assert headers["content-length"] == "2000" and body == DATA[1000:3000]
    status, headers, body = _get(served, "/artifact?X-Amz-Signature=abc", {"Range": "bytes=-16"})
    assert (status, body) == (206, DATA[-16:])


def test_whole_file_without_range(served: RangeServer) -> None:
    status, headers, body = _get(served, "/artifact")
    assert status == 200 and body == DATA and headers["accept-ranges"] == "bytes"
    assert "content-range" not in headers
    # The count moves after the last byte left, which the client may read first.
    wait_for(lambda: served.bytes_sent == len(DATA), 10, "the server to count what it sent")


def test_unsatisfiable_range_is_416(served: RangeServer) -> None:
    status, headers, body = _get(served, "/artifact", {"Range": "bytes=20000-"})
    assert status == 416 and headers["content-range"] == "bytes */10240" and body == b""


def test_other_methods_are_not_served(served: RangeServer) -> None:
    for method in ("POST", "PUT", "DELETE", "OPTIONS", "TRACE"):
        status, headers, _ = _get(served, "/artifact", method=method)
        assert (status, headers["allow"]) == (405, "GET, HEAD"), method


def test_head_has_headers_and_no_body(served: RangeServer) -> None:
    status, headers, body = _get(served, "/artifact", {"Range": "bytes=0-9"}, method="HEAD")
    assert status == 206 and headers["content-length"] == "10" and body == b""
    assert served.bytes_sent == 0


def test_keep_alive_serves_many_ranges_on_one_connection(served: RangeServer) -> None:
    host, port = served.url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=10)
    for start in range(0, len(DATA), 4096):
        conn.request("GET", "/artifact", headers={"Range": f"bytes={start}-{start + 4095}"})
        response = conn.getresponse()
        assert response.read() == DATA[start:start + 4096]
    sock = conn.sock
    conn.request("GET", "/artifact", headers={"Range": "bytes=0-0"})
    assert conn.getresponse().read() == DATA[:1] and conn.sock is sock
    conn.close()


def test_quoted_names_are_served(served: RangeServer) -> None:
    assert _get(served, "/sub/a%20b")[2] == b"spaced"


@pytest.mark.parametrize("path", [
    "/../secret", "/%2e%2e/secret", "/sub/../../secret", "/..%2fsecret", "//etc/passwd", "/link-out", "/sub",
    "/", "/missing", "/artifact%00",
])
def test_nothing_outside_the_directory_and_no_listing(served: RangeServer, path: str) -> None:
    status, _, body = _get(served, path)
    assert status == 404, path
    assert b"SECRET" not in body and b"root:" not in body

"""The artifact Range server at its smallest edges: a suffix range of a one-byte file, an empty file served whole,
and one request counted once. ./scripts/mutants runs these for edgectl/artifacts/range_server.py."""

from __future__ import annotations

import http.client
from pathlib import Path

import pytest

from edgectl.artifacts import RangeNotSatisfiable, RangeServer, parse_range


def test_a_suffix_range_of_a_one_byte_file_is_that_byte_and_of_an_empty_file_unsatisfiable() -> None:
    assert parse_range("bytes=-1", 1) == (0, 0)
    assert parse_range("bytes=-5", 1) == (0, 0)
    assert parse_range("bytes=-1", 2) == (1, 1)
    for header, size in (("bytes=-1", 0), ("bytes=-0", 1)):
        with pytest.raises(RangeNotSatisfiable):
            parse_range(header, size)


def _get(server: RangeServer, path: str) -> tuple[int, dict[str, str], bytes]:
    host, port = server.url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=10)
    try:
        conn.request("GET", path)
        response = conn.getresponse()
        return response.status, {k.lower(): v for k, v in response.getheaders()}, response.read()
    finally:
        conn.close()


def test_an_empty_file_is_served_whole_and_each_request_is_counted_once(tmp_path: Path) -> None:
    (tmp_path / "empty").write_bytes(b"")
    (tmp_path / "one").write_bytes(b"x")
    server = RangeServer(tmp_path).start()
    try:
        status, headers, body = _get(server, "/empty")
        assert (status, headers["content-length"], body) == (200, "0", b"")
        assert server.requests == 1
        assert _get(server, "/one")[2] == b"x" and server.requests == 2
    finally:
        server.stop()

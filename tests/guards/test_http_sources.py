"""HTTP Range sources that answer wrong: another size, another range, too few bytes, a bad chunk, endless redirects.

A real HTTP server in this process answers each request as the case says; the fetcher must take
only bytes the signed manifest accounts for and give the source up (``fetch`` returns False, the
download keeps only the chunks that matched), never take more than it asked for.
"""

from __future__ import annotations

import hashlib
import logging
import re
import threading
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from edgecore.delivery.download import Download
from edgecore.delivery.http_fetch import HttpFetch, HttpSettings
from edgecore.errors import OperationFailed
from edgecore.protocol.manifest import PayloadInfo

CHUNK = 1024
DATA = b"".join(hashlib.sha256(bytes([i])).digest() for i in range(80))  # 2560 bytes, 3 chunks
INFO = PayloadInfo(len(DATA), hashlib.sha256(DATA).hexdigest(), CHUNK,
                   tuple(hashlib.sha256(DATA[i:i + CHUNK]).hexdigest() for i in range(0, len(DATA), CHUNK)))

# An answer: (status, headers, body), from the asked range (lo, hi).
Answer = Callable[[int, int], tuple[int, dict[str, str], bytes]]


def honest(lo: int, hi: int) -> tuple[int, dict[str, str], bytes]:
    return 206, {"Content-Range": f"bytes {lo}-{hi}/{len(DATA)}"}, DATA[lo:hi + 1]


class Origin:
    """Answers every GET with ``answer``; counts the requests."""

    def __init__(self) -> None:
        self.answer: Answer = honest
        self.asked: list[str] = []
        origin = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_GET(self) -> None:
                asked = self.headers.get("Range", "")
                origin.asked.append(asked)
                match = re.fullmatch(r"bytes=(\d+)-(\d+)", asked)
                lo, hi = (int(match[1]), int(match[2])) if match else (0, len(DATA) - 1)
                status, headers, body = origin.answer(lo, hi)
                self.send_response(status)
                for key, value in {"Content-Length": str(len(body)), **headers}.items():
                    self.send_header(key, value)
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/a"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


@pytest.fixture(scope="module")
def origin() -> Iterator[Origin]:
    served = Origin()
    yield served
    served.server.shutdown()


def fetch(origin: Origin, tmp_path: Path, answer: Answer) -> tuple[bool, Download]:
    origin.answer, origin.asked = answer, []
    download = Download(tmp_path, INFO, free_bytes=lambda _p: 10**12)
    return HttpFetch(HttpSettings(timeout_s=5)).fetch(download, [origin.url]), download


def test_an_honest_source_fills_the_download_in_one_request(origin: Origin, tmp_path: Path) -> None:
    done, download = fetch(origin, tmp_path, honest)
    assert done and download.finish().read_bytes() == DATA and origin.asked == [f"bytes=0-{len(DATA) - 1}"]


def test_a_source_that_ignores_the_range_may_send_the_whole_payload(origin: Origin, tmp_path: Path) -> None:
    done, download = fetch(origin, tmp_path, lambda lo, hi: (200, {}, DATA))
    assert done and download.finish().read_bytes() == DATA


def test_a_shorter_answer_is_used_to_its_last_whole_chunk_and_the_rest_asked_again(origin: Origin, tmp_path: Path) -> None:
    def short(lo: int, hi: int) -> tuple[int, dict[str, str], bytes]:
        end = min(hi, lo + 1500)  # one chunk and a half
        return 206, {"Content-Range": f"bytes {lo}-{end}/{len(DATA)}"}, DATA[lo:end + 1]

    done, _ = fetch(origin, tmp_path, short)
    assert done and origin.asked == ["bytes=0-2559", "bytes=1024-2559", "bytes=2048-2559"]


def test_an_open_ended_total_is_taken(origin: Origin, tmp_path: Path) -> None:
    done, _ = fetch(origin, tmp_path, lambda lo, hi: (206, {"Content-Range": f"bytes {lo}-{hi}/*"}, DATA[lo:hi + 1]))
    assert done


WRONG: dict[str, Answer] = {
    "whole payload of another size": lambda lo, hi: (200, {}, DATA + b"x"),
    "not found": lambda lo, hi: (404, {}, b""),
    "range not satisfiable": lambda lo, hi: (416, {}, b""),
    "no Content-Range": lambda lo, hi: (206, {}, DATA),
    "unreadable Content-Range": lambda lo, hi: (206, {"Content-Range": f"bytes {lo}-{hi}"}, DATA),
    "another total": lambda lo, hi: (206, {"Content-Range": f"bytes {lo}-{hi}/{len(DATA) + 1}"}, DATA[lo:hi + 1]),
    "another start": lambda lo, hi: (206, {"Content-Range": f"bytes {lo + 1}-{hi}/{len(DATA)}"}, DATA[lo + 1:hi + 1]),
    "more than asked": lambda lo, hi: (206, {"Content-Range": f"bytes {lo}-{hi + 1}/{len(DATA)}"}, DATA[lo:hi + 2]),
    "less than one chunk": lambda lo, hi: (206, {"Content-Range": f"bytes {lo}-{lo + 9}/{len(DATA)}"}, DATA[lo:lo + 10]),
    "a body that ends early": lambda lo, hi: (206, {"Content-Range": f"bytes {lo}-{hi}/{len(DATA)}",
                                                    "Content-Length": "1500"}, DATA[lo:lo + 1500]),
    "a damaged chunk": lambda lo, hi: (206, {"Content-Range": f"bytes {lo}-{hi}/{len(DATA)}"},
                                       DATA[lo:lo + 1100] + b"\0" + DATA[lo + 1101:hi + 1]),
    "a redirect without a Location": lambda lo, hi: (302, {}, b""),
    "endless redirects": lambda lo, hi: (302, {"Location": "/a"}, b""),
}


REASONS = {  # what the log says the source did wrong
    "whole payload of another size": "serves 2561 bytes, the signed payload has 2560",
    "not found": "HTTP 404 Not Found",
    "range not satisfiable": "HTTP 416",
    "no Content-Range": "206 with an unreadable Content-Range",
    "unreadable Content-Range": "206 with an unreadable Content-Range",
    "another total": "serves 2561 bytes, the signed payload has 2560",
    "another start": "asked for bytes 0-2559, got 1-2559",
    "more than asked": "asked for bytes 0-2559, got 0-2560",
    "an end before its start": "asked for bytes 1024-2559, got 1024-1023",
    "less than one chunk": "answered without a whole chunk",
    "a body that ends early": "the body ended early, in chunk 1",
    "a damaged chunk": "chunk 1 does not match its signed sha256",
    "a redirect without a Location": "HTTP 302 without a Location",
    "endless redirects": "redirects",
    "a single byte": "answered without a whole chunk",
    "one byte short of a chunk": "answered without a whole chunk",
    "one byte short of the end, always": "answered without a whole chunk",
}
WRONG["an end before its start"] = lambda lo, hi: (  # a first chunk, then an empty range ending before it starts
    (206, {"Content-Range": f"bytes {lo}-{lo + 1023}/{len(DATA)}"}, DATA[lo:lo + 1024]) if lo == 0
    else (206, {"Content-Range": f"bytes {lo}-{lo - 1}/{len(DATA)}"}, b""))
WRONG["a single byte"] = lambda lo, hi: (206, {"Content-Range": f"bytes {lo}-{lo}/{len(DATA)}"}, DATA[lo:lo + 1])
WRONG["one byte short of a chunk"] = lambda lo, hi: (206, {"Content-Range": f"bytes {lo}-{lo + 1022}/{len(DATA)}"},
                                                     DATA[lo:lo + 1023])
WRONG["one byte short of the end, always"] = lambda lo, hi: (206, {"Content-Range": f"bytes {lo}-{hi - 1}/{len(DATA)}"},
                                                             DATA[lo:hi])


@pytest.mark.parametrize("case", list(WRONG))
def test_a_source_that_answers_wrong_is_given_up_keeping_only_good_chunks(origin: Origin, tmp_path: Path, case: str,
                                                                          caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="edgecore.delivery.http_fetch"):
        done, download = fetch(origin, tmp_path, WRONG[case])
    assert not done and not download.complete
    assert [r.getMessage() for r in caplog.records if REASONS[case] in r.getMessage()], (case, caplog.text)
    for index in download.have:
        assert download.part.read_bytes()[index * CHUNK:(index + 1) * CHUNK] == DATA[index * CHUNK:(index + 1) * CHUNK]
    if case == "a damaged chunk":
        assert download.have == {0} and download.rejected == 1
    if case == "endless redirects":
        followed = re.search(r"more than (\d+) redirects", caplog.text)
        assert followed is not None and len(origin.asked) == int(followed[1]) + 1
    elif case == "one byte short of the end, always":
        assert download.have == {0, 1}  # taken to the last whole chunk; the last one never comes whole
    else:
        assert len(origin.asked) <= 3


@pytest.mark.parametrize("status", [301, 302, 303, 307, 308])
def test_a_redirect_is_followed(origin: Origin, tmp_path: Path, status: int) -> None:
    def moved(lo: int, hi: int) -> tuple[int, dict[str, str], bytes]:
        if len(origin.asked) == 1:
            return status, {"Location": "/elsewhere"}, b""
        return honest(lo, hi)

    done, _ = fetch(origin, tmp_path, moved)
    assert done and len(origin.asked) == 2


def test_chunks_the_download_already_holds_are_not_a_bad_source(origin: Origin, tmp_path: Path) -> None:
    origin.answer, origin.asked = (lambda lo, hi: (200, {}, DATA)), []
    download = Download(tmp_path, INFO, free_bytes=lambda _p: 10**12)
    assert download.accept(0, DATA[:CHUNK])
    assert HttpFetch(HttpSettings(timeout_s=5)).fetch(download, [origin.url]) and download.rejected == 0


def test_a_full_disk_is_not_a_bad_source_and_is_raised(origin: Origin, tmp_path: Path) -> None:
    origin.answer, origin.asked = honest, []
    download = Download(tmp_path, INFO, free_bytes=lambda _p: 10**12, quota_bytes=CHUNK)
    with pytest.raises(OperationFailed, match="disk full while downloading"):
        HttpFetch(HttpSettings(timeout_s=5)).fetch(download, [origin.url, origin.url])
    assert len(origin.asked) == 1  # the next source would fill the same disk

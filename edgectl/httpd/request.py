"""One request head, parsed by llhttp (``httptools``), with the checks RFC 9112 asks beyond it.

llhttp refuses what is malformed: the request line, an unknown method, field names and values
with bytes they may not hold, obsolete line folding, a ``Content-Length`` that is not digits,
overflows 64 bits or appears twice (even with the same value), and ``Content-Length`` beside
``Transfer-Encoding``. This module adds exactly one ``Host`` in HTTP/1.1, major version 1, no
transfer coding but ``chunked``, and turns an absolute-form target into the path routes see.
"""

from __future__ import annotations

from dataclasses import dataclass

import httptools

__all__ = ["HttpError", "RequestHead", "parse_head"]


class HttpError(Exception):
    """A request answered with ``status`` and a one-line ``message``; ``close``: the connection ends after it."""

    def __init__(self, status: int, message: str, headers: dict[str, str] | None = None, close: bool = True) -> None:
        super().__init__(message)
        self.status, self.message, self.close = status, message, close
        self.headers = dict(headers or {})


@dataclass
class RequestHead:
    """A parsed request line and headers; names are lower case, repeated fields joined with ``", "``."""

    method: str
    target: str  # origin form: path and query, as sent
    headers: dict[str, str]
    peer: str
    version: str = "1.1"
    keep_alive: bool = True
    chunked: bool = False
    content_length: int = 0


class _Head:
    """The callbacks llhttp calls while it parses one head."""

    def __init__(self) -> None:
        self.url = b""
        self.fields: list[tuple[bytes, bytes]] = []
        self.done = self.keep_alive = False
        self.parser = httptools.HttpRequestParser(self)

    def on_url(self, url: bytes) -> None:
        self.url += url

    def on_header(self, name: bytes, value: bytes) -> None:
        self.fields.append((name, value))

    def on_headers_complete(self) -> None:
        self.done = True
        # Asked here: llhttp forgets an HTTP/1.0 keep-alive once the message (a head without a body) completes.
        self.keep_alive = self.parser.should_keep_alive()


def parse_head(raw: bytes, peer: str) -> RequestHead:
    """The request a head (request line to the blank line) describes; HttpError for one that breaks the protocol."""
    head = _Head()
    parser = head.parser
    try:
        parser.feed_data(raw)
    except httptools.HttpParserInvalidMethodError:
        raise HttpError(501, "malformed request: the method is not one this server knows") from None
    except httptools.HttpParserUpgrade:
        pass  # an Upgrade offer is ignored (RFC 9110 7.8): answered as HTTP/1.1
    except httptools.HttpParserError as exc:
        raise HttpError(400, f"malformed request: {exc}") from None
    if not head.done:
        raise HttpError(400, "malformed request: the head does not end where its blank line is")
    version = parser.get_http_version()
    if not version.startswith("1."):
        raise HttpError(505, f"HTTP/{version} is not supported: this server speaks HTTP/1.1")
    headers: dict[str, str] = {}
    hosts = 0
    for name, value in head.fields:
        key, text = name.lower().decode("latin-1"), value.rstrip(b" \t").decode("latin-1")
        headers[key] = f"{headers[key]}, {text}" if key in headers else text
        hosts += key == "host"
    if hosts > 1 or (hosts == 0 and version != "1.0"):
        raise HttpError(400, f"an HTTP/{version} request needs exactly one Host header; it has {hosts}")
    coding = headers.get("transfer-encoding")
    if coding is not None and coding.strip().lower() != "chunked":
        raise HttpError(501, f"Transfer-Encoding '{coding[:60]}' is not supported; send a Content-Length")
    length = headers.get("content-length")
    return RequestHead(parser.get_method().decode("ascii"), _origin_form(head.url), headers, peer, version,
                       head.keep_alive, coding is not None, int(length) if length is not None else 0)


def _origin_form(url: bytes) -> str:
    """The path and query of a target; an absolute-form target's authority is dropped (RFC 9112 3.2.2)."""
    if url.startswith(b"/") or url == b"*":
        return url.decode("latin-1")
    try:
        parts = httptools.parse_url(url)
    except httptools.HttpParserInvalidURLError:
        raise HttpError(400, f"malformed request target '{url[:80].decode('latin-1')}'") from None
    if not parts.schema or parts.schema.lower() not in (b"http", b"https"):
        raise HttpError(400, f"request target '{url[:80].decode('latin-1')}' is neither a path nor an http URL")
    path = parts.path or b"/"
    return (path + b"?" + parts.query if parts.query else path).decode("latin-1")

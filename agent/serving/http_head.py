"""One HTTP/1.1 request head, parsed by llhttp (through ``httptools``), and what RFC 9112 asks beyond it.

llhttp decides the framing and refuses what is malformed: request line, version syntax, field-name
tokens, bytes that are not allowed in the target or a field value, obsolete line folding, a
``Content-Length`` that is not ASCII digits or appears twice, ``Content-Length`` beside
``Transfer-Encoding``. This module adds the server's own checks: exactly one ``Host`` in HTTP/1.1
(at most one in 1.0), HTTP major version 1, and no transfer coding but ``chunked``. It also turns
an absolute-form target (``GET http://host/path``) into the path the routes see.

The connection reads a ``Content-Length`` body itself (one copy, see ``http_body.read_body``), so
a parser sees heads and chunked bodies only; it serves the connection's next request when it saw
the last one whole, and a fresh one takes over after a ``Content-Length`` body.
"""

from __future__ import annotations

from dataclasses import dataclass

import httptools

__all__ = ["BadRequest", "Incoming", "Request", "parse_head"]


@dataclass(slots=True)
class Request:
    """One parsed request; header names are lower case, repeated fields joined with ``", "``."""

    method: str
    path: str  # origin form: path and query
    headers: dict[str, str]
    body: bytes = b""
    peer: str = ""
    reserved: int = 0  # bytes held in the budget for this request; the handler may add more
    version: str = "1.1"
    keep_alive: bool = True
    chunked: bool = False
    content_length: int = 0


class BadRequest(Exception):
    """The head breaks the protocol: answer ``status`` with ``str(exc)`` and close."""

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.status = status


class Incoming:
    """The callbacks llhttp calls while it parses a connection's requests (the ``httptools`` protocol object).

    A plain class with slots, not a dataclass: the loop touches it for every request. One parser
    serves a connection's requests in turn as long as it saw each one whole; a ``Content-Length``
    body, which the connection reads past it, or an ``Upgrade`` offer, which pauses it, ends its use.
    """

    __slots__ = ("chunks", "fields", "head_done", "keep_alive", "message_done", "parser", "upgraded", "url")

    def __init__(self) -> None:
        self.url = b""
        self.fields: list[tuple[bytes, bytes]] = []
        self.head_done = False
        self.message_done = False
        self.keep_alive = False
        self.upgraded = False
        self.chunks: list[bytes] = []
        self.parser: httptools.HttpRequestParser | None = httptools.HttpRequestParser(self)

    @property
    def reusable(self) -> bool:
        """Whether the next request can be fed to this parser."""
        return self.parser is not None and self.message_done and not self.upgraded

    def on_message_begin(self) -> None:
        self.url = b""
        self.fields = []
        self.head_done = self.message_done = self.keep_alive = False

    def on_url(self, url: bytes) -> None:
        self.url += url

    def on_header(self, name: bytes, value: bytes) -> None:
        self.fields.append((name, value))

    def headers(self) -> tuple[dict[str, str], int]:
        """Field names lower case, values without trailing whitespace (llhttp keeps it), repeats joined; Host count."""
        headers: dict[str, str] = {}
        hosts = 0
        for name, value in self.fields:
            key = name.lower().decode("latin-1")
            text = value.rstrip(b" \t").decode("latin-1")
            if key in headers:
                headers[key] = f"{headers[key]}, {text}"
            else:
                headers[key] = text
            if key == "host":
                hosts += 1
        return headers, hosts

    def on_headers_complete(self) -> None:
        self.head_done = True
        assert self.parser is not None
        # Asked here: llhttp forgets an HTTP/1.0 keep-alive once the message completes.
        self.keep_alive = self.parser.should_keep_alive()

    def on_body(self, data: bytes) -> None:
        self.chunks.append(data)

    def on_message_complete(self) -> None:
        self.message_done = True

    def release(self) -> None:
        """Drop the parser once the message needs it no more.

        The parser and this object refer to each other: left to the cycle collector, such pairs fill
        the young generation and bring full collections on the serving loop.
        """
        self.parser = None

    def feed(self, data: bytes) -> None:
        """Give llhttp more of this request; BadRequest when it refuses them."""
        assert self.parser is not None, "the message was complete: its parser is released"
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            self.upgraded = True  # an Upgrade offer is ignored (RFC 9110 7.8): the request is served as HTTP/1.1
        except httptools.HttpParserError as exc:
            raise BadRequest(f"malformed request: {exc}") from None


def parse_head(head: bytes, peer: str, previous: Incoming | None = None) -> tuple[Request, Incoming]:
    """The request a head (request line to the blank line) describes, and its parser (for a chunked body, and
    for the connection's next request when it is ``reusable``; pass it back as ``previous``)."""
    if previous is not None and previous.reusable:
        incoming = previous
    else:
        if previous is not None:
            previous.release()
        incoming = Incoming()
    parser = incoming.parser
    assert parser is not None
    incoming.feed(head)
    if not incoming.head_done:
        raise BadRequest("malformed request: the head does not end where its blank line is")
    version = parser.get_http_version()
    if not version.startswith("1."):
        raise BadRequest(f"HTTP/{version} is not supported: this server speaks HTTP/1.1", 505)
    headers, hosts = incoming.headers()
    if hosts > 1 or (hosts == 0 and version != "1.0"):
        raise BadRequest(f"an HTTP/{version} request needs exactly one Host header; it has {hosts}")
    coding = headers.get("transfer-encoding")
    if coding is not None and coding.strip().lower() != "chunked":
        raise BadRequest(f"Transfer-Encoding '{coding[:60]}' is not supported; send chunked or Content-Length", 501)
    length = headers.get("content-length")
    request = Request(
        method=parser.get_method().decode("ascii"),
        path=_origin_form(incoming.url),
        headers=headers,
        peer=peer,
        version=version,
        keep_alive=incoming.keep_alive,
        chunked=coding is not None,
        content_length=int(length) if length is not None else 0,  # llhttp took only ASCII digits
    )
    return request, incoming


def _origin_form(url: bytes) -> str:
    """The path and query of a target; an absolute-form target's authority is dropped (RFC 9112 3.2.2)."""
    if url.startswith(b"/") or url == b"*":
        return url.decode("latin-1")
    try:
        parts = httptools.parse_url(url)
    except httptools.HttpParserInvalidURLError:
        raise BadRequest(f"malformed request target '{url[:80].decode('latin-1')}'") from None
    if not parts.schema or parts.schema.lower() not in (b"http", b"https"):
        raise BadRequest(f"request target '{url[:80].decode('latin-1')}' is neither a path nor an http URL")
    path = parts.path or b"/"
    return (path + b"?" + parts.query if parts.query else path).decode("latin-1")

"""The HTTP server of the REST API, ``/metrics`` and the web console, on the standard library.

``http.server.ThreadingHTTPServer`` with the route table of :mod:`edgectl.api.router`: no new
dependency, no event loop beside the controller's own, and it runs in the controller process (a
thread) or alone (``edgectl api serve``). Every answer is JSON except ``/metrics`` and console
files; every error is ``{"error": {"status", "message", "field"?}}``.
"""

from __future__ import annotations

import json
import logging
import shutil
import sqlite3
import ssl
import tempfile
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

from agent.errors import ConfigError, EdgeError, NotFoundError, OperationFailed, UserError, VerificationError
from agent.serving.access import is_loopback
from edgectl.api.context import ApiContext
from edgectl.api.router import ApiError, Request, Response, Route, Router, check_body, check_query
from edgectl.json_text import dumps

__all__ = ["ApiServer", "parse_listen", "server_tls"]

log = logging.getLogger(__name__)

CONSOLE = "/console/"
MAX_JSON_BYTES = 1 << 20
READ_CHUNK = 1 << 16


def parse_listen(text: str) -> tuple[str, int]:
    """``HOST:PORT`` (``[::1]:8470`` for IPv6); ConfigError naming the value."""
    host, sep, port = text.rpartition(":")
    host = host.strip("[]")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) < 65536:
        raise ConfigError(f"api.listen / --http {text!r}: expected HOST:PORT, e.g. 127.0.0.1:8470")
    return host, int(port)


def server_tls(cert: Path | None, key: Path | None) -> ssl.SSLContext | None:
    """A TLS server context when ``api.tls_cert`` and ``api.tls_key`` are set; ConfigError when only one is."""
    if cert is None and key is None:
        return None
    if cert is None or key is None:
        raise ConfigError("api.tls_cert and api.tls_key go together: set both, or neither")
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        context.load_cert_chain(str(cert), str(key))
    except (OSError, ssl.SSLError) as exc:
        raise ConfigError(f"api.tls_cert/tls_key: cannot load {cert} and {key} ({exc})") from None
    return context


def _json(data: Any) -> bytes:
    return dumps(data).encode()


class ApiServer:
    """Serves the route table on ``host:port`` (TLS when given); ``start()`` in a thread, ``stop()``."""

    def __init__(self, ctx: ApiContext, routes: list[Route], host: str, port: int, tls: ssl.SSLContext | None = None,
                 insecure: bool = False) -> None:
        if not is_loopback(host) and tls is None and not insecure:
            raise ConfigError(f"api.listen {host}:{port} is not loopback and has no TLS: set api.tls_cert and api.tls_key, "
                              "or api.insecure: true to send tokens in clear text on purpose")
        if not is_loopback(host) and tls is None:
            log.warning("REST API on %s:%d without TLS (api.insecure: true): tokens travel in clear text", host, port)
        self.ctx, self.router, self.tls = ctx, Router(routes), tls
        self.httpd = _Server((host, port), _handler(self), ctx.store.release)
        self.httpd.daemon_threads = True
        if tls is not None:  # the handshake happens in the request's thread, not in accept()
            self.httpd.socket = tls.wrap_socket(self.httpd.socket, server_side=True, do_handshake_on_connect=False)
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        address, port = self.httpd.server_address[:2]
        host = address.decode() if isinstance(address, bytes) else str(address)
        return f"{'https' if self.tls else 'http'}://{f'[{host}]' if ':' in host else host}:{port}"

    def start(self) -> ApiServer:
        self._thread = threading.Thread(target=self.httpd.serve_forever, name="edgectl-api", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        if self._thread is not None:
            self._thread.join(5)

    # -- one request ------------------------------------------------------------------------------

    def dispatch(self, handler: BaseHTTPRequestHandler) -> None:
        start = time.perf_counter()
        route: Route | None = None
        upload: Path | None = None
        try:
            split = urlsplit(handler.path)
            path = unquote(split.path)
            if handler.command == "GET" and (path == "/" or path.startswith(CONSOLE)):
                self._close_if_unread(handler)
                return self._send(handler, self._console(path))
            route, path_params = self.router.match(handler.command, path)
            headers = {k.lower(): v for k, v in handler.headers.items()}
            request = Request(handler.command, path, path_params, parse_qs(split.query, keep_blank_values=True), headers)
            self._authorize(route, request)
            request.values = check_query(route.params, request.query)
            if route.body is not None:
                request.values["body"] = self._json_body(handler, route)
            elif route.upload is not None:
                upload = request.upload = self._upload(handler)
            response = route.handler(request)
        except Exception as exc:  # every failure becomes a JSON answer
            response = self._error(exc)
        finally:
            if upload is not None:
                shutil.rmtree(upload.parent, ignore_errors=True)
        self._close_if_unread(handler)
        self._send(handler, response)
        self.ctx.requests.observe(handler.command, route.path if route else "unmatched", response.status,
                             time.perf_counter() - start)

    @staticmethod
    def _close_if_unread(handler: BaseHTTPRequestHandler) -> None:
        """A body left unread (a refusal, a chunked body, or a route that takes none: POST .../pause with "{}")
        would be read as the start of the next request on this connection ("{}GET ..." -> 501): close it instead."""
        sent = handler.headers.get("Transfer-Encoding") or handler.headers.get("Content-Length", "0").strip() not in ("", "0")
        if sent and not getattr(handler, "body_read", False):
            handler.close_connection = True

    def _authorize(self, route: Route, request: Request) -> None:
        if route.role is None or (route.path == "/metrics" and self.ctx.metrics_open):
            return
        with self.ctx.timer.time("authenticate"):
            principal = self.ctx.accounts.authenticate(request.headers.get("authorization"))
        if principal is None:
            raise ApiError(401, "a valid bearer token is needed (Authorization: Bearer edgectl_...; see `edgectl tokens create`)",
                           headers={"WWW-Authenticate": 'Bearer realm="edgectl"'})
        if not principal.role.allows(route.role):
            raise ApiError(403, f"{route.method} {route.path} needs the {route.role} role; {principal.user} is {principal.role}")
        request.principal = principal

    @staticmethod
    def _console(path: str) -> Response:
        """The web console's files (edgectl.console); ``/`` leads there."""
        from edgectl.console import HEADERS, console_asset

        if path == "/":
            return Response(302, b"", "text/plain", {"Location": CONSOLE})
        asset = console_asset(path)
        if asset is None:
            raise ApiError(404, f"no such console file: {path}")
        return Response(200, asset.body, asset.content_type, {**HEADERS, "ETag": asset.etag})

    @staticmethod
    def _length(handler: BaseHTTPRequestHandler, limit: int) -> int:
        if handler.headers.get("Transfer-Encoding"):
            raise ApiError(411, "send the body with a Content-Length (chunked transfer encoding is not accepted)")
        text = handler.headers.get("Content-Length", "0")
        if not text.isdigit():
            raise ApiError(400, f"Content-Length {text!r} is not a number")
        if int(text) > limit:
            raise ApiError(413, f"the body is {int(text)} bytes, over the limit of {limit}")
        return int(text)

    def _json_body(self, handler: BaseHTTPRequestHandler, route: Route) -> Any:
        length = self._length(handler, MAX_JSON_BYTES)
        raw = handler.rfile.read(length)
        handler.body_read = True  # type: ignore[attr-defined]
        try:
            body = json.loads(raw) if raw else None
        except (ValueError, UnicodeDecodeError):
            raise ApiError(400, "body: not valid JSON") from None
        assert route.body is not None
        check_body(route.body, body)
        return body

    def _upload(self, handler: BaseHTTPRequestHandler) -> Path:
        length = self._length(handler, self.ctx.max_upload_bytes)
        if length == 0:
            raise ApiError(400, "body: empty; send the .edgepkg file as the request body")
        folder = Path(tempfile.mkdtemp(prefix="edgectl-upload-"))
        path = folder / "upload.edgepkg"
        left = length
        with path.open("wb") as out:
            while left:
                chunk = handler.rfile.read(min(READ_CHUNK, left))
                if not chunk:
                    raise ApiError(400, f"body: ended after {length - left} of {length} bytes")
                out.write(chunk)
                left -= len(chunk)
        handler.body_read = True  # type: ignore[attr-defined]
        return path

    @staticmethod
    def _error(exc: Exception) -> Response:
        if isinstance(exc, ApiError):
            error = exc
        elif isinstance(exc, NotFoundError):
            error = ApiError(404, str(exc))
        elif isinstance(exc, VerificationError):
            error = ApiError(422, str(exc))
        elif isinstance(exc, UserError):
            error = ApiError(400, str(exc))
        elif isinstance(exc, OperationFailed):
            error = ApiError(409, str(exc))
        elif isinstance(exc, sqlite3.OperationalError) or _store_unavailable(exc):
            log.warning("store busy: %s", exc)
            error = ApiError(503, "the store is busy; retry", headers={"Retry-After": "1"})
        else:
            log.error("API request failed", exc_info=exc)
            kind = "edgectl error" if isinstance(exc, EdgeError) else "internal error"
            error = ApiError(500, f"{kind}: {str(exc).splitlines()[0] if str(exc) else type(exc).__name__} "
                                  "(see the controller log)")
        return Response(error.status, error.body(), headers=error.headers)

    @staticmethod
    def _send(handler: BaseHTTPRequestHandler, response: Response) -> None:
        body = response.body if isinstance(response.body, bytes) else _json(response.body)
        handler.send_response(response.status)
        handler.send_header("Content-Type", response.content_type)
        handler.send_header("Content-Length", str(len(body)))
        if "Cache-Control" not in response.headers:
            handler.send_header("Cache-Control", "no-store")
        handler.send_header("X-Content-Type-Options", "nosniff")
        for key, value in response.headers.items():
            handler.send_header(key, value)
        if handler.close_connection:
            handler.send_header("Connection", "close")
        handler.end_headers()
        if handler.command != "HEAD":
            handler.wfile.write(body)


def _store_unavailable(exc: Exception) -> bool:
    """A PostgreSQL store that is unreachable or restarting (psycopg's OperationalError): worth a retry."""
    return any(c.__module__.startswith("psycopg") and c.__name__ == "OperationalError" for c in type(exc).__mro__)


class _Server(ThreadingHTTPServer):
    """A thread per connection; when a connection's thread ends, the store takes back its connections."""

    def __init__(self, address: tuple[str, int], handler: type[BaseHTTPRequestHandler], release: Callable[[], None]) -> None:
        super().__init__(address, handler)
        self.release = release

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self.release()


def _handler(server: ApiServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        server_version = "edgectl-api"
        sys_version = ""
        timeout = 60  # a client that stops sending frees its thread

        def handle_one_request(self) -> None:
            self.body_read = False
            try:
                super().handle_one_request()
            except (ssl.SSLError, ConnectionError, TimeoutError) as exc:
                log.debug("API connection ended: %s", exc)
                self.close_connection = True

        def do_GET(self) -> None:
            server.dispatch(self)

        do_POST = do_PUT = do_DELETE = do_PATCH = do_GET

        def log_message(self, format: str, *args: Any) -> None:
            log.debug("%s " + format, self.address_string(), *args)

    return Handler

"""The HTTP server of the REST API, ``/metrics`` and the web console.

The route table of :mod:`edgectl.api.router` on the bounded server of :mod:`edgectl.httpd` (asyncio
connections parsed by llhttp, with header, idle, body and send timeouts, connection limits per
process and per address, TLS handshakes with a timeout). Connections cost no thread: a request's
route, token and query are checked, and its handler runs, on a fixed pool of ``api.workers``
threads, so the store sees at most that many sessions from the API. Its body is read in between,
only once the caller may send it. Every answer is JSON except ``/metrics`` and console files;
every error is ``{"error": {"status", "message", "field"?}}``; HEAD is answered as GET without
the body, any other method a route does not take with 405 and ``Allow``.
"""

from __future__ import annotations

import asyncio
import logging
import re
import shutil
import sqlite3
import ssl
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

from edgecore.addresses import is_loopback
from edgecore.errors import ConfigError, EdgeError, NotFoundError, OperationFailed, UserError, VerificationError
from edgectl.api.context import ApiContext
from edgectl.api.router import ApiError, Request, Response, Route, Router, check_body, check_query, not_allowed, read_json
from edgectl.controller.store.protocol import StoreUnavailable
from edgectl.httpd import Body, HttpError, HttpServer, Reply, RequestHead, ServerLimits
from edgectl.json_text import dumps

__all__ = ["WORKERS", "ApiServer", "check_exposure", "parse_listen", "server_tls"]

log = logging.getLogger(__name__)

CONSOLE = "/console/"
MAX_JSON_BYTES = 1 << 20
WORKERS = 8  # threads that check requests and run handlers: the most store sessions the API holds


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


def check_exposure(host: str, port: int, tls: ssl.SSLContext | None, insecure: bool) -> None:
    """Off loopback, tokens travel only over TLS unless ``api.insecure`` says otherwise (then with a warning)."""
    if is_loopback(host) or tls is not None:
        return
    if not insecure:
        raise ConfigError(f"api.listen {host}:{port} is not loopback and has no TLS: set api.tls_cert and api.tls_key, "
                          "or api.insecure: true to send tokens in clear text on purpose")
    log.warning("REST API on %s:%d without TLS (api.insecure: true): tokens travel in clear text", host, port)


def _json(data: Any) -> bytes:
    return dumps(data).encode()


@dataclass
class _Call:
    """A request admitted to its route: who calls, with which query; the body comes next."""

    route: Route
    request: Request
    upload: Path | None = None


class ApiServer:
    """Serves the route table on ``host:port`` (TLS when given); ``start()`` in a thread, ``stop()``."""

    def __init__(self, ctx: ApiContext, routes: list[Route], host: str, port: int, tls: ssl.SSLContext | None = None,
                 insecure: bool = False, limits: ServerLimits = ServerLimits(), workers: int = WORKERS) -> None:
        check_exposure(host, port, tls, insecure)
        self.ctx, self.router, self.tls = ctx, Router(routes), tls
        self.pool = ThreadPoolExecutor(workers, thread_name_prefix="edgectl-api")
        self.http = HttpServer(host, port, self._handle, _error_reply, tls, limits, "edgectl-api")

    @property
    def url(self) -> str:
        return self.http.url

    @property
    def port(self) -> int:
        return self.http.port

    def start(self) -> ApiServer:
        self.http.start()
        return self

    def stop(self) -> None:
        self.http.stop()
        self.pool.shutdown(wait=False, cancel_futures=True)

    # -- one request ------------------------------------------------------------------------------

    async def _handle(self, head: RequestHead, body: Body) -> Reply:
        start = time.perf_counter()
        loop = asyncio.get_running_loop()
        call = await loop.run_in_executor(self.pool, self._admit, head)
        if isinstance(call, Response):
            response = call
        else:
            try:
                raw = await self._receive(call, body)
                response = await loop.run_in_executor(self.pool, self._respond, call, raw)
            except HttpError as exc:
                response = _error(ApiError(exc.status, exc.message, headers=exc.headers))
            finally:
                if call.upload is not None:
                    shutil.rmtree(call.upload.parent, ignore_errors=True)
        route = call.route.path if isinstance(call, _Call) else "unmatched"
        self.ctx.requests.observe(head.method, route, response.status, time.perf_counter() - start)
        return _reply(response)

    def _admit(self, head: RequestHead) -> _Call | Response:
        """On a worker: the route, the caller's token and the query; the answer instead when one of them fails."""
        try:
            split = urlsplit(head.target)
            path = unquote(split.path)
            if path == "/" or path.startswith(CONSOLE):
                if head.method not in ("GET", "HEAD"):
                    raise not_allowed(head.method, path, ["GET"])
                return self._console(path)
            route, path_params = self.router.match(head.method, path)
            request = Request(head.method, path, path_params, parse_qs(split.query, keep_blank_values=True), head.headers)
            self._authorize(route, request)
            request.values = check_query(route.params, request.query)
            return _Call(route, request)
        except Exception as exc:  # every failure becomes a JSON answer
            return _error(exc, self.ctx.private_paths)
        finally:
            self.ctx.store.release()

    async def _receive(self, call: _Call, body: Body) -> bytes:
        """On the loop: the body a route takes (JSON in memory, a package upload into a temporary file)."""
        if call.route.body is not None:
            return await body.read(MAX_JSON_BYTES)
        if call.route.upload is not None:
            call.upload = Path(tempfile.mkdtemp(prefix="edgectl-upload-")) / "upload.edgepkg"
            if await body.save(call.upload, self.ctx.max_upload_bytes) == 0:
                raise HttpError(400, "body: empty; send the .edgepkg file as the request body")
        return b""

    def _respond(self, call: _Call, raw: bytes) -> Response:
        """On a worker: the body checked against the route's schema, then the route's handler."""
        route, request = call.route, call.request
        try:
            if route.body is not None:
                value = read_json(raw)
                check_body(route.body, value)
                request.values["body"] = value
            request.upload = call.upload
            return route.handler(request)
        except Exception as exc:  # every failure becomes a JSON answer
            return _error(exc, self.ctx.private_paths)
        finally:
            self.ctx.store.release()

    def _authorize(self, route: Route, request: Request) -> None:
        if route.role is None:  # the route table alone says what is open (api.metrics_open: edgectl.api.app)
            return
        with self.ctx.timer.time("authenticate"):
            principal = self.ctx.accounts.authenticate(request.headers.get("authorization"))
        if principal is None and self.ctx.sso is not None:  # a JWT from the provider: 401/403 saying why when refused
            principal = self.ctx.sso.authenticate(request.headers.get("authorization"))
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


def _error(exc: Exception, private: tuple[str, ...] = ()) -> Response:
    """The JSON answer for what a request raised; paths under ``private`` are named ``<server path>``."""
    error = _api_error(exc)
    for root in private:
        error.message = re.sub(re.escape(root) + r"(?=/|\b)[^\s'\",;:)]*", "<server path>", error.message)
    return Response(error.status, error.body(), headers=error.headers)


def _api_error(exc: Exception) -> ApiError:
    if isinstance(exc, ApiError):
        error = exc
    elif isinstance(exc, StoreUnavailable):  # down, restarting, read-only, full: one clear 503, whatever asked it
        error = ApiError(503, str(exc), headers={"Retry-After": "5"})
    elif isinstance(exc, NotFoundError):
        error = ApiError(404, str(exc))
    elif isinstance(exc, VerificationError):
        error = ApiError(422, str(exc))
    elif isinstance(exc, UserError):
        error = ApiError(400, str(exc))
    elif isinstance(exc, OperationFailed):
        error = ApiError(409, str(exc))
    elif _store_busy(exc):
        log.warning("store busy: %s", exc)
        error = ApiError(503, "the store is busy; retry", headers={"Retry-After": "1"})
    else:
        log.error("API request failed", exc_info=exc)
        kind = "edgectl error" if isinstance(exc, EdgeError) else "internal error"
        error = ApiError(500, f"{kind} (see the controller log)")
    return error


def _error_reply(exc: HttpError) -> Reply:
    """What the connection itself answers (a malformed head, a timeout, over capacity), as the API's JSON error."""
    return _reply(_error(ApiError(exc.status, exc.message, headers=exc.headers)))


def _reply(response: Response) -> Reply:
    body = response.body if isinstance(response.body, bytes) else _json(response.body)
    headers = {"X-Content-Type-Options": "nosniff", **response.headers}
    headers.setdefault("Cache-Control", "no-store")
    return Reply(response.status, body, response.content_type, headers)


def _store_busy(exc: Exception) -> bool:
    """A store worth retrying: SQLite locked or busy, PostgreSQL unreachable or restarting (psycopg's OperationalError).

    Any other SQLite OperationalError is a query this code got wrong: a 500, never a retry loop."""
    if isinstance(exc, sqlite3.OperationalError):
        return any(word in str(exc) for word in ("locked", "busy"))
    return any(c.__module__.startswith("psycopg") and c.__name__ == "OperationalError" for c in type(exc).__mro__)

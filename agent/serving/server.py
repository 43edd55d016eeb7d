"""The local inference HTTP server: KServe v2 REST routes plus Prometheus ``/metrics``.

Stdlib ``ThreadingHTTPServer`` with HTTP/1.1 keep-alive and TCP_NODELAY: one thread per client
connection, enough for on-device clients and well under the 1 ms overhead goal (see
docs/benchmarks.md). Every error becomes a JSON ``{"error": ...}`` response; the server keeps
serving.
"""

from __future__ import annotations

import json
import logging
import re
import threading
import time
from collections.abc import Callable
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import unquote

from agent import __version__
from agent.errors import EdgeError, NotFoundError, UserError
from agent.serving.kserve import encode_response, parse_request, tensor_metadata
from agent.serving.registry import ModelRegistry
from agent.telemetry import prometheus_text

__all__ = ["DEFAULT_MAX_REQUEST_BYTES", "InferenceServer"]

log = logging.getLogger(__name__)

DEFAULT_MAX_REQUEST_BYTES = 64 * 2**20
_MODEL_ROUTE = re.compile(r"^/v2/models/([^/]+)(?:/versions/([^/]+))?(/ready|/infer)?$")
_HEADER_LENGTH = "Inference-Header-Content-Length"


class InferenceServer:
    """Serves a ModelRegistry over HTTP on ``host:port`` (port 0 picks a free one)."""

    def __init__(
        self,
        registry: ModelRegistry,
        host: str = "127.0.0.1",
        port: int = 0,
        max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES,
        device_metrics: Callable[[], dict[str, Any]] | None = None,
    ) -> None:
        self.registry = registry
        self.max_request_bytes = max_request_bytes
        self.device_metrics = device_metrics
        self._httpd = _Server((host, port), _Handler)
        self._httpd.app = self
        self._thread: threading.Thread | None = None

    @property
    def port(self) -> int:
        """The bound port (useful with port 0)."""
        return int(self._httpd.server_address[1])

    @property
    def url(self) -> str:
        """``http://host:port``."""
        host = self._httpd.server_address[0]
        return f"http://{host}:{self.port}"

    def start(self) -> None:
        """Serve in a background daemon thread."""
        self._thread = threading.Thread(target=self._httpd.serve_forever, name="inference-http", daemon=True)
        self._thread.start()
        log.info("local inference API on %s", self.url)

    def stop(self) -> None:
        """Stop accepting, close the socket and wait for the serving thread."""
        self._httpd.shutdown()
        self._httpd.server_close()
        if self._thread is not None:
            self._thread.join(timeout=10)


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    app: InferenceServer


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True  # header and body go out as two writes: no 40 ms Nagle stall
    server: _Server

    def do_GET(self) -> None:
        self._dispatch("GET")

    def do_POST(self) -> None:
        self._dispatch("POST")

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("%s %s", self.address_string(), format % args)

    def _dispatch(self, method: str) -> None:
        try:
            self._route(method, self.path.split("?", 1)[0])
        except NotFoundError as exc:
            self._json(HTTPStatus.NOT_FOUND, {"error": str(exc)})
        except UserError as exc:
            self._json(HTTPStatus.BAD_REQUEST, {"error": str(exc)})
        except EdgeError as exc:
            self._json(HTTPStatus.INTERNAL_SERVER_ERROR, {"error": str(exc)})
        except Exception as exc:
            log.exception("request %s %s failed", method, self.path)
            self._json(HTTPStatus.INTERNAL_SERVER_ERROR, {"error": f"internal error: {exc}"})

    def _route(self, method: str, path: str) -> None:
        app = self.server.app
        if method == "GET" and path in ("/v2/health/live", "/v2/health/ready"):
            self._json(HTTPStatus.OK, {"live" if path.endswith("live") else "ready": True})
        elif method == "GET" and path == "/v2":
            self._json(HTTPStatus.OK, {"name": "edge-agent", "version": __version__, "extensions": ["binary_tensor_data"]})
        elif method == "GET" and path == "/metrics":
            device = app.device_metrics() if app.device_metrics else None
            body = prometheus_text(app.registry.telemetry(), device).encode()
            self._send(HTTPStatus.OK, body, "text/plain; version=0.0.4; charset=utf-8")
        elif match := _MODEL_ROUTE.match(path):
            name, version, action = unquote(match.group(1)), match.group(2), match.group(3)
            self._model_route(method, name, unquote(version) if version else None, action)
        else:
            self._discard_body()
            self._json(HTTPStatus.NOT_FOUND, {"error": f"no route for {method} {path}"})

    def _model_route(self, method: str, name: str, version: str | None, action: str | None) -> None:
        if method == "POST" and action == "/infer":
            self._infer(name, version)
            return
        if method != "GET" or action == "/infer":
            self._discard_body()
            self._json(HTTPStatus.METHOD_NOT_ALLOWED, {"error": f"{method} not allowed here"})
            return
        entry = self.server.app.registry.get(name)
        _check_version(entry.name, entry.version, version)
        if action == "/ready":
            self._json(HTTPStatus.OK, {"name": name, "ready": True})
            return
        self._json(HTTPStatus.OK, {
            "name": name,
            "versions": [entry.version],
            "platform": entry.runner.name,
            "inputs": [tensor_metadata(spec) for spec in entry.inputs],
            "outputs": [tensor_metadata(spec) for spec in entry.outputs],
        })

    def _infer(self, name: str, version: str | None) -> None:
        body = self._read_body()
        if body is None:
            return
        with self.server.app.registry.acquire(name) as entry:
            start = time.perf_counter()
            ok = False
            try:
                _check_version(entry.name, entry.version, version)
                header_length = self.headers.get(_HEADER_LENGTH)
                request = parse_request(body, _int_header(header_length), entry.inputs)
                results = entry.runner.infer(request.feeds)
                payload, json_length = encode_response(name, entry.version, results, request)
                ok = True
                self.server.app.registry.remember_inputs(entry, request.feeds)
            finally:
                entry.stats.record(time.perf_counter() - start, ok)
        extra = {_HEADER_LENGTH: str(json_length)} if json_length is not None else {}
        content_type = "application/octet-stream" if json_length is not None else "application/json"
        self._send(HTTPStatus.OK, payload, content_type, extra)

    def _read_body(self) -> bytes | None:
        """The request body, or None after answering 411/413 (then the connection closes)."""
        length = _int_header(self.headers.get("Content-Length"))
        if length is None:
            self.close_connection = True
            self._json(HTTPStatus.LENGTH_REQUIRED, {"error": "Content-Length is required"})
            return None
        limit = self.server.app.max_request_bytes
        if length > limit:
            # Do not read it: answer and drop the connection instead of buffering an attacker's bytes.
            self.close_connection = True
            self._json(HTTPStatus.REQUEST_ENTITY_TOO_LARGE, {"error": f"request is {length} bytes; the limit is {limit}"})
            return None
        return self.rfile.read(length)

    def _discard_body(self) -> None:
        length = _int_header(self.headers.get("Content-Length")) or 0
        if 0 < length <= self.server.app.max_request_bytes:
            self.rfile.read(length)
        elif length:
            self.close_connection = True

    def _json(self, status: HTTPStatus, body: dict[str, Any]) -> None:
        self._send(status, json.dumps(body).encode(), "application/json")

    def _send(self, status: HTTPStatus, body: bytes, content_type: str, extra: dict[str, str] | None = None) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        for key, value in (extra or {}).items():
            self.send_header(key, value)
        if self.close_connection:
            self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write(body)


def _check_version(name: str, published: str, asked: str | None) -> None:
    if asked is not None and asked != published:
        raise NotFoundError(f"model '{name}' version '{asked}' is not published (serving '{published}')")


def _int_header(value: str | None) -> int | None:
    if value is None:
        return None
    try:
        number = int(value)
    except ValueError as exc:
        raise UserError(f"header value '{value}' is not an integer") from exc
    if number < 0:
        raise UserError(f"header value '{value}' is negative")
    return number

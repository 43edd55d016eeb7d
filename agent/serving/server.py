"""The local inference HTTP server: KServe v2 / Open Inference Protocol REST routes plus ``/metrics``.

Connections are served on one asyncio event loop (``http11``), so idle and slow clients cost no
thread; inference runs on a fixed pool of ``workers`` threads behind a queue of at most
``max_queue`` requests. Every request body is reserved in a byte budget (``max_inflight_bytes``;
a JSON body counts ``JSON_WEIGHT`` times its size, what Python objects cost while decoding). What
does not fit now is answered 503 with ``Retry-After``; what never fits, 413. Outputs whose size
the input shapes determine are forecast before the model runs and refused above
``max_response_bytes``; an allocation failure inside the runtime answers 500 and the server keeps
serving. Every error is the protocol's JSON ``{"error": ...}``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import socket
import ssl
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote

from agent import __version__
from agent.errors import ConfigError, EdgeError, NotFoundError, UserError
from agent.serving.access import Access, read_token, server_tls_context
from agent.serving.http11 import ByteBudget, HttpLimits, Request, Response, error, json_response, serve_connection
from agent.serving.kserve import encode_response, parse_request, platform_of, runtime_feeds, tensor_metadata
from agent.serving.memory import forecast_output_bytes, is_out_of_memory, limit_address_space
from agent.serving.registry import ModelRegistry
from agent.telemetry import prometheus_text

__all__ = ["DEFAULT_MAX_REQUEST_BYTES", "JSON_WEIGHT", "InferenceServer", "ServingLimits"]

log = logging.getLogger(__name__)

DEFAULT_MAX_REQUEST_BYTES = 64 * 2**20
JSON_WEIGHT = 8  # a JSON number of ~4 characters becomes a 32-byte Python float while decoding
BACKLOG = 1024
_MODEL_ROUTE = re.compile(r"^/v2/models/([^/]+)(?:/versions/([^/]+))?(/ready|/infer)?$")
_HEADER_LENGTH = "inference-header-content-length"


@dataclass(frozen=True)
class ServingLimits:
    """Concurrency and memory bounds of the server (configs/agent.yaml ``inference.*``)."""

    workers: int = 4
    max_queue: int = 64
    max_inflight_bytes: int = 256 * 2**20
    max_response_bytes: int = 64 * 2**20


class InferenceServer:
    """Serves a ModelRegistry over HTTP(S) on ``host:port`` (port 0 picks a free one)."""

    def __init__(
        self,
        registry: ModelRegistry,
        host: str = "127.0.0.1",
        port: int = 0,
        max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES,
        device_metrics: Callable[[], dict[str, Any]] | None = None,
        *,
        limits: ServingLimits = ServingLimits(),
        http: HttpLimits | None = None,
        token: str | None = None,
        tls: ssl.SSLContext | None = None,
        insecure: bool = False,
        memory_limit_mb: int | None = 0,
    ) -> None:
        Access.check_exposure(host, token, tls, insecure)
        self.registry = registry
        self.device_metrics = device_metrics
        self.limits = limits
        self.http = http or HttpLimits(max_request_bytes=max_request_bytes)
        self.max_request_bytes = self.http.max_request_bytes
        self.access = Access(token)
        self.budget = ByteBudget(limits.max_inflight_bytes)
        self._tls = tls
        self._memory_limit_mb = memory_limit_mb  # applied by start(): None = auto, 0 = leave the process alone
        self._pool = ThreadPoolExecutor(max_workers=limits.workers, thread_name_prefix="inference")
        self._pending = 0
        self._pending_lock = threading.Lock()
        self._connections: set[asyncio.Task[None]] = set()
        self._sock = socket.create_server((host, port), family=_family(host), backlog=BACKLOG, reuse_port=False)
        self._loop = asyncio.new_event_loop()
        self._thread: threading.Thread | None = None
        self._server: asyncio.Server | None = None

    @classmethod
    def from_settings(cls, registry: ModelRegistry, settings: Any,
                      device_metrics: Callable[[], dict[str, Any]] | None = None) -> InferenceServer:
        """A server configured from ``AgentConfig.inference`` (its start applies the address-space cap)."""
        token = read_token(settings.token_file) if settings.token_file is not None else None
        tls = None
        if (settings.tls_cert is None) != (settings.tls_key is None):
            raise ConfigError("inference.tls_cert and inference.tls_key must be given together")
        if settings.tls_cert is not None:
            tls = server_tls_context(settings.tls_cert, settings.tls_key, settings.client_ca)
        elif settings.client_ca is not None:
            raise ConfigError("inference.client_ca needs inference.tls_cert and tls_key")
        limits = ServingLimits(workers=settings.workers, max_queue=settings.max_queue,
                               max_inflight_bytes=settings.max_inflight_bytes,
                               max_response_bytes=settings.max_response_bytes)
        http = HttpLimits(max_request_bytes=settings.max_request_bytes, header_timeout_s=settings.header_timeout_s,
                          body_timeout_s=settings.body_timeout_s, idle_timeout_s=settings.idle_timeout_s,
                          max_connections=settings.max_connections)
        server = cls(registry, settings.host, settings.port, device_metrics=device_metrics, limits=limits, http=http,
                     token=token, tls=tls, insecure=settings.insecure, memory_limit_mb=settings.memory_limit_mb)
        return server

    @property
    def port(self) -> int:
        """The bound port (useful with port 0)."""
        return int(self._sock.getsockname()[1])

    @property
    def url(self) -> str:
        """``http(s)://host:port``."""
        host = self._sock.getsockname()[0]
        host = f"[{host}]" if ":" in host else host
        return f"{'https' if self._tls else 'http'}://{host}:{self.port}"

    def start(self) -> None:
        """Cap the address space (when asked), then serve in a background daemon thread."""
        limit_address_space(self._memory_limit_mb)
        self._server = self._loop.run_until_complete(asyncio.start_server(
            self._connection, sock=self._sock, ssl=self._tls, limit=self.http.max_header_bytes, backlog=BACKLOG,
            ssl_handshake_timeout=self.http.header_timeout_s if self._tls else None))
        self._thread = threading.Thread(target=self._loop.run_forever, name="inference-http", daemon=True)
        self._thread.start()
        log.info("local inference API on %s", self.url)

    def stop(self) -> None:
        """Stop accepting, drop open connections, wait for the loop thread, stop the workers."""
        if self._thread is not None and self._thread.is_alive():
            future = asyncio.run_coroutine_threadsafe(self._close(), self._loop)
            with contextlib.suppress(Exception):
                future.result(timeout=10)
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=10)
        if not self._loop.is_running():
            self._loop.close()
        self._sock.close()
        self._pool.shutdown(wait=False, cancel_futures=True)

    async def _close(self) -> None:
        if self._server is not None:
            self._server.close()
        for task in list(self._connections):
            task.cancel()
        await asyncio.gather(*self._connections, return_exceptions=True)

    # -- connections ------------------------------------------------------------------------------

    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        over = len(self._connections) >= self.http.max_connections
        self._connections.add(task)
        try:
            await serve_connection(reader, writer, self.http, self.budget, self._admit, self._handle, over)
        except asyncio.CancelledError:
            pass  # stop() cancels open connections: nothing to report
        finally:
            self._connections.discard(task)

    def _admit(self, request: Request, length: int) -> Response | None:
        """Reserve the request's memory, or say why it cannot be served (None: go ahead)."""
        if not self.access.allows(request.path.split("?", 1)[0], request.headers.get("authorization")):
            return error(401, "missing or wrong bearer token", {"WWW-Authenticate": 'Bearer realm="edge-agent"'})
        cost = length
        if request.method == "POST":
            header = request.headers.get(_HEADER_LENGTH)
            json_part = int(header) if header is not None and header.isdigit() else length
            cost = length + JSON_WEIGHT * min(json_part, length)
        if cost > self.budget.limit:
            return error(413, f"request would hold {cost} bytes while decoding (JSON counts {JSON_WEIGHT}x) and the "
                              f"in-flight limit is {self.budget.limit}: send large tensors as binary data", close=True)
        if request.method == "POST" and self._queue_full():
            return error(503, "inference queue is full; retry later", {"Retry-After": "1"})
        if not self.budget.try_reserve(cost):
            return error(503, "too many bytes in flight; retry later", {"Retry-After": "1"})
        request.reserved = cost
        return None

    def _queue_full(self) -> bool:
        return self._pending >= self.limits.workers + self.limits.max_queue

    async def _handle(self, request: Request) -> Response:
        path = request.path.split("?", 1)[0]
        response = await self._route(request, path)
        response.head_only = request.method == "HEAD"
        return response

    async def _route(self, request: Request, path: str) -> Response:
        method = "GET" if request.method == "HEAD" else request.method
        allowed = _allowed_methods(path)
        if allowed is None:
            return error(404, f"no route for {request.method} {path[:200]}")
        if method not in allowed:
            return error(405, f"{request.method} is not allowed on {path[:200]}; use {', '.join(allowed)}",
                         {"Allow": ", ".join([*allowed, "HEAD"] if "GET" in allowed else allowed)})
        if path == "/v2/health/live":
            return json_response(200, {"live": True})
        if path == "/v2/health/ready":
            ready = bool(self.registry.names())
            return json_response(200 if ready else 503, {"ready": ready})
        if path in ("/v2", "/v2/"):
            return json_response(200, {"name": "edge-agent", "version": __version__, "extensions": ["binary_tensor_data"]})
        if path == "/metrics":
            device = self.device_metrics() if self.device_metrics else None
            body = prometheus_text(self.registry.telemetry(), device).encode()
            return Response(200, body, "text/plain; version=0.0.4; charset=utf-8")
        match = _MODEL_ROUTE.match(path)
        assert match is not None  # _allowed_methods matched it
        name, version, action = unquote(match.group(1)), match.group(2), match.group(3)
        version = unquote(version) if version else None
        if action == "/infer":
            return await self._submit(request, name, version)
        return _guarded(lambda: self._model_info(name, version, action))

    def _model_info(self, name: str, version: str | None, action: str | None) -> Response:
        entry = self.registry.get(name)
        _check_version(entry.name, entry.version, version)
        if action == "/ready":
            return json_response(200, {"name": name, "ready": True})
        return json_response(200, {
            "name": name,
            "versions": [entry.version],
            "platform": platform_of(entry.runner.name),
            "inputs": [tensor_metadata(spec) for spec in entry.inputs],
            "outputs": [tensor_metadata(spec) for spec in entry.outputs],
            "parameters": {"backend": entry.runner.name, "placement": str(entry.placement.get("verdict", ""))},
        })

    async def _submit(self, request: Request, name: str, version: str | None) -> Response:
        with self._pending_lock:
            if self._queue_full():
                return error(503, "inference queue is full; retry later", {"Retry-After": "1"})
            self._pending += 1
        try:
            return await self._loop.run_in_executor(self._pool, self._infer, request, name, version)
        finally:
            with self._pending_lock:
                self._pending -= 1

    def _infer(self, request: Request, name: str, version: str | None) -> Response:
        """Runs on a worker thread: decode, forecast, run, encode; every failure is a JSON answer."""
        return _guarded(lambda: self._infer_unguarded(request, name, version))

    def _infer_unguarded(self, request: Request, name: str, version: str | None) -> Response:
        with self.registry.acquire(name) as entry:
            start = time.perf_counter()
            ok = False
            try:
                _check_version(entry.name, entry.version, version)
                header_length = _int_header(request.headers.get(_HEADER_LENGTH))
                decoded = parse_request(request.body, header_length, entry.inputs)
                feeds = runtime_feeds(decoded.feeds)
                entry.runner.check_feeds(feeds)
                self._check_forecast(entry.inputs, entry.outputs, feeds)
                results = entry.runner.infer(feeds, check=False)
                self._check_size(results, decoded.outputs)
                payload, json_length = encode_response(name, entry.version, results, decoded)
                ok = True
                self.registry.remember_inputs(entry, feeds)
            finally:
                entry.stats.record(time.perf_counter() - start, ok)
        if json_length is None:
            return Response(200, payload, "application/json")
        return Response(200, payload, "application/octet-stream", {"Inference-Header-Content-Length": str(json_length)})

    def _check_forecast(self, inputs: Any, outputs: Any, feeds: Any) -> None:
        sizes = forecast_output_bytes(inputs, outputs, feeds)
        total = sum(sizes.values())
        if total > self.limits.max_response_bytes:
            biggest = max(sizes, key=lambda k: sizes[k])
            raise UserError(f"outputs would be {total} bytes ('{biggest}' alone {sizes[biggest]}); "
                            f"the limit is {self.limits.max_response_bytes} (inference.max_response_bytes)")


    def _check_size(self, results: dict[str, Any], asked: list[str] | None) -> None:
        names = asked if asked is not None else list(results)
        total = sum(getattr(results.get(n), "nbytes", 0) for n in names)
        if total > self.limits.max_response_bytes:
            raise UserError(f"outputs are {total} bytes; the limit is {self.limits.max_response_bytes} "
                            "(inference.max_response_bytes)")


def _guarded(work: Callable[[], Response]) -> Response:
    """Run ``work``; turn every exception into the protocol's JSON error answer."""
    try:
        return work()
    except NotFoundError as exc:
        return error(404, str(exc))
    except UserError as exc:
        return error(400, str(exc))
    except EdgeError as exc:
        return error(500, str(exc))
    except Exception as exc:
        if is_out_of_memory(exc):
            log.warning("inference ran out of memory: %s", str(exc).splitlines()[0][:200])
            return error(500, "the model ran out of memory on this request; the server keeps serving")
        log.exception("request failed")
        return error(500, f"internal error: {str(exc).splitlines()[0][:300] if str(exc) else type(exc).__name__}")


def _allowed_methods(path: str) -> list[str] | None:
    """The methods a path answers, or None when no route has it."""
    if path in ("/v2/health/live", "/v2/health/ready", "/v2", "/v2/", "/metrics"):
        return ["GET"]
    match = _MODEL_ROUTE.match(path)
    if match is None:
        return None
    return ["POST"] if match.group(3) == "/infer" else ["GET"]


def _check_version(name: str, published: str, asked: str | None) -> None:
    if asked is not None and asked != published:
        raise NotFoundError(f"model '{name}' version '{asked}' is not published (serving '{published}')")


def _int_header(value: str | None) -> int | None:
    if value is None:
        return None
    if not value.strip().isdigit():
        raise UserError(f"header value '{value[:40]}' is not a non-negative integer")
    return int(value)


def _family(host: str) -> socket.AddressFamily:
    return socket.AF_INET6 if ":" in host else socket.AF_INET

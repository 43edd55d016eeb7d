"""The local inference server: KServe v2 / Open Inference Protocol REST routes plus ``/metrics``, and gRPC.

Connections are served on one asyncio event loop (``http11``; with ``grpc_port``, the gRPC server
of ``grpc_server`` on the same loop), so idle and slow clients cost no thread; inference runs on
the shared ``InferencePool`` (``pool``): a fixed number of worker threads behind a bounded queue.
Every request body is reserved in a byte budget (``max_inflight_bytes``; a JSON body counts
``JSON_WEIGHT`` times its size, what Python objects cost while decoding). What does not fit now is
answered 503 with ``Retry-After``; what never fits, 413. An allocation failure inside the runtime
answers 500 and the server keeps serving. Every error is the protocol's JSON ``{"error": ...}``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import socket
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote

import numpy as np

from agent import __version__
from agent.serving.access import Access, TlsFiles, read_token
from agent.serving.http11 import HttpLimits, Request, Response, error, json_response, serve_connection
from agent.serving.kserve import InferRequest, encode_response, parse_request, platform_of, tensor_metadata
from agent.serving.memory import limit_address_space
from agent.serving.metrics import CONTENT_TYPE, metrics_renderer
from agent.serving.pool import JSON_WEIGHT, Failure, InferencePool, QueueFull, ServingLimits, check_version, describe_failure
from agent.serving.published import ModelRegistry, PublishedModel
from edgecore.errors import ConfigError

if TYPE_CHECKING:  # grpcio is an optional extra: imported only when grpc_port is set
    from agent.serving.grpc_server import GrpcServer

__all__ = ["DEFAULT_MAX_REQUEST_BYTES", "JSON_WEIGHT", "InferenceServer", "ServingLimits"]

log = logging.getLogger(__name__)

DEFAULT_MAX_REQUEST_BYTES = 64 * 2**20
BACKLOG = 1024
_MODEL_ROUTE = re.compile(r"^/v2/models/([^/]+)(?:/versions/([^/]+))?(/ready|/infer)?$")
_HEADER_LENGTH = "inference-header-content-length"
_STATUS = {Failure.NOT_FOUND: 404, Failure.INVALID: 400, Failure.INTERNAL: 500}


class InferenceServer:
    """Serves a ModelRegistry over HTTP(S) on ``host:port`` (port 0 picks a free one), and gRPC on ``grpc_port``."""

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
        tls: TlsFiles | None = None,
        insecure: bool = False,
        memory_limit_mb: int | None = 0,
        grpc_port: int | None = None,
    ) -> None:
        Access.check_exposure(host, token, tls, insecure)
        self.registry = registry
        self.limits = limits
        self.http = http or HttpLimits(max_request_bytes=max_request_bytes)
        self.max_request_bytes = self.http.max_request_bytes
        self.access = Access(token)
        self.pool = InferencePool(registry, limits)
        self.budget = self.pool.budget
        self._render_metrics = metrics_renderer(self.pool, device_metrics)
        self._tls = tls
        self._ssl = tls.ssl_context() if tls is not None else None
        self._memory_limit_mb = memory_limit_mb  # applied by start(): None = auto, 0 = leave the process alone
        self._connections: set[asyncio.Task[None]] = set()
        self._sock = socket.create_server((host, port), family=_family(host), backlog=BACKLOG, reuse_port=False)
        self._loop = asyncio.new_event_loop()
        self._thread: threading.Thread | None = None
        self._server: asyncio.Server | None = None
        self.grpc = self._grpc_server(host, grpc_port) if grpc_port is not None else None

    @classmethod
    def from_settings(cls, registry: ModelRegistry, settings: Any,
                      device_metrics: Callable[[], dict[str, Any]] | None = None) -> InferenceServer:
        """A server configured from ``AgentConfig.inference`` (its start applies the address-space cap)."""
        token = read_token(settings.token_file) if settings.token_file is not None else None
        tls = None
        if (settings.tls_cert is None) != (settings.tls_key is None):
            raise ConfigError("inference.tls_cert and inference.tls_key must be given together")
        if settings.tls_cert is not None:
            tls = TlsFiles(settings.tls_cert, settings.tls_key, settings.client_ca)
        elif settings.client_ca is not None:
            raise ConfigError("inference.client_ca needs inference.tls_cert and tls_key")
        limits = ServingLimits(workers=settings.workers, max_queue=settings.max_queue,
                               max_inflight_bytes=settings.max_inflight_bytes,
                               max_response_bytes=settings.max_response_bytes)
        http = HttpLimits(max_request_bytes=settings.max_request_bytes, header_timeout_s=settings.header_timeout_s,
                          body_timeout_s=settings.body_timeout_s, idle_timeout_s=settings.idle_timeout_s,
                          max_connections=settings.max_connections)
        return cls(registry, settings.host, settings.port, device_metrics=device_metrics, limits=limits, http=http,
                   token=token, tls=tls, insecure=settings.insecure, memory_limit_mb=settings.memory_limit_mb,
                   grpc_port=settings.grpc_port)

    def _grpc_server(self, host: str, port: int) -> GrpcServer:
        try:
            from agent.serving.grpc_server import GrpcLimits, GrpcServer
        except ImportError as exc:
            raise ConfigError(f"inference.grpc_port is set but gRPC cannot be served ({exc}): "
                              "install the agent's grpc extra (pip install 'edgectl[grpc]')") from None
        limits = GrpcLimits(self.http.max_request_bytes, self.limits.max_response_bytes, self.http.max_connections,
                            self.http.idle_timeout_s)
        return GrpcServer(self.pool, self.access, host, port, limits, self._tls)

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
            self._connection, sock=self._sock, ssl=self._ssl, limit=self.http.max_header_bytes, backlog=BACKLOG,
            ssl_handshake_timeout=self.http.header_timeout_s if self._ssl else None))
        if self.grpc is not None:
            self._loop.run_until_complete(self.grpc.start())
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
        self.pool.close()

    async def _close(self) -> None:
        if self.grpc is not None:
            await self.grpc.stop()
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
            json_part = _digits(header) if header is not None else length
            if header is not None and json_part is None:
                return error(400, f"Inference-Header-Content-Length '{header[:40]}' is not a non-negative integer")
            cost = length + JSON_WEIGHT * min(json_part or 0, length)
        if cost > self.budget.limit:
            return error(413, f"request would hold {cost} bytes while decoding (JSON counts {JSON_WEIGHT}x on top of its own "
                              f"size, {JSON_WEIGHT + 1}x in all) and the in-flight limit is {self.budget.limit}: "
                              "send large tensors as binary data", close=True)
        if request.method == "POST" and self.pool.queue_full():
            return error(503, "inference queue is full; retry later", {"Retry-After": "1"})
        if not self.budget.try_reserve(cost):
            return error(503, "too many bytes in flight; retry later", {"Retry-After": "1"})
        request.reserved = cost
        return None

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
            return json_response(200, {"name": "edge-agent", "version": __version__,
                                       "extensions": ["binary_tensor_data", "model_repository"]})
        if path == "/v2/repository/index":  # the protocol's model repository extension (Triton's answer: a list)
            return json_response(200, self.registry.index())
        if path == "/v2/models":
            return json_response(200, {"models": self.registry.index()})
        if path == "/metrics":
            return Response(200, self._render_metrics(), CONTENT_TYPE)
        match = _MODEL_ROUTE.match(path)
        assert match is not None  # _allowed_methods matched it
        name, version, action = unquote(match.group(1)), match.group(2), match.group(3)
        version = unquote(version) if version else None
        try:
            if action == "/infer":
                return await self._infer(request, name, version)
            return self._model_info(name, version, action)
        except QueueFull as exc:
            return error(503, str(exc), {"Retry-After": "1"})
        except Exception as exc:
            kind, message = describe_failure(exc)
            return error(_STATUS[kind], message)

    def _model_info(self, name: str, version: str | None, action: str | None) -> Response:
        entry = self.registry.get(name)
        check_version(entry.name, entry.version, version)
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

    async def _infer(self, request: Request, name: str, version: str | None) -> Response:
        header = request.headers.get(_HEADER_LENGTH)
        header_length = _digits(header) if header is not None else None  # _admit refused one that is not digits

        def decode(entry: PublishedModel) -> InferRequest:
            return parse_request(request.body, header_length, entry.inputs)

        def encode(entry: PublishedModel, results: dict[str, np.ndarray], decoded: InferRequest) -> Response:
            payload, json_length = encode_response(entry.name, entry.version, results, decoded)
            if json_length is None:
                return Response(200, payload, "application/json")
            return Response(200, payload, "application/octet-stream", {"Inference-Header-Content-Length": str(json_length)})

        return await self.pool.run(name, version, decode, encode)


def _allowed_methods(path: str) -> list[str] | None:
    """The methods a path answers, or None when no route has it."""
    if path in ("/v2/health/live", "/v2/health/ready", "/v2", "/v2/", "/metrics", "/v2/models"):
        return ["GET"]
    if path == "/v2/repository/index":
        return ["POST"]
    match = _MODEL_ROUTE.match(path)
    if match is None:
        return None
    return ["POST"] if match.group(3) == "/infer" else ["GET"]


def _digits(value: str) -> int | None:
    """The integer an ASCII-digits header value says; None for anything else (``²`` is a digit to ``str.isdigit``)."""
    value = value.strip()
    return int(value) if value.isascii() and value.isdigit() else None


def _family(host: str) -> socket.AddressFamily:
    return socket.AF_INET6 if ":" in host else socket.AF_INET

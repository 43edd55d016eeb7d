"""The Open Inference Protocol over gRPC (``inference.GRPCInferenceService``), on ``grpcio``'s asyncio server.

It runs on the HTTP server's event loop and shares its limits: the same worker pool and queue (a
full queue answers ``RESOURCE_EXHAUSTED``), the same byte budget, ``max_request_bytes`` as the
largest message received, the same model registry, the same bearer token (``authorization``
metadata) and certificate files (mutual TLS when ``client_ca`` is set). ``ServerLive`` and
``ServerReady`` stay open, as ``/v2/health/*`` do. Served: ServerLive, ServerReady, ModelReady,
ServerMetadata, ModelMetadata, ModelInfer, ModelStreamInfer (one answer per request, errors in
``error_message`` without ending the stream, as Triton does) and RepositoryIndex.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import grpc
import numpy as np

from agent import __version__
from agent.serving.access import Access, TlsFiles
from agent.serving.grpc_codec import decode_infer, encode_infer, typed_bytes
from agent.serving.kserve import InferRequest, platform_of, tensor_metadata
from agent.serving.oip import inference_pb2 as pb
from agent.serving.pool import JSON_WEIGHT, Failure, InferencePool, QueueFull, check_version, describe_failure
from agent.serving.published import PublishedModel

__all__ = ["SERVICE", "GrpcLimits", "GrpcServer"]

log = logging.getLogger(__name__)

SERVICE = "inference.GRPCInferenceService"
OPEN_RPCS = frozenset({"ServerLive", "ServerReady"})
_STATUS = {Failure.NOT_FOUND: grpc.StatusCode.NOT_FOUND, Failure.INVALID: grpc.StatusCode.INVALID_ARGUMENT,
           Failure.INTERNAL: grpc.StatusCode.INTERNAL}


@dataclass(frozen=True)
class GrpcLimits:
    """Message sizes and concurrency of the gRPC server (from the ``inference.*`` settings)."""

    max_request_bytes: int = 64 * 2**20
    max_response_bytes: int = 64 * 2**20
    max_concurrent_rpcs: int = 2048
    idle_timeout_s: float = 60.0


class _Refusal(Exception):
    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(message)
        self.code = code


class GrpcServer:
    """Serves the registry behind ``pool`` over gRPC on ``host:port`` (port 0 picks a free one)."""

    def __init__(self, pool: InferencePool, access: Access, host: str, port: int, limits: GrpcLimits,
                 tls: TlsFiles | None = None) -> None:
        self.pool = pool
        self.access = access
        self.limits = limits
        self._address = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        self._host = host
        self._credentials = _credentials(tls) if tls is not None else None  # read now: a bad file fails the start
        self._server: Any = None
        self.port = 0

    async def start(self) -> None:
        """Bind and serve (on the running loop)."""
        slack = 2**20  # the message's own framing around the tensors the response limit counts
        server = grpc.aio.server(maximum_concurrent_rpcs=self.limits.max_concurrent_rpcs, options=[
            ("grpc.max_receive_message_length", self.limits.max_request_bytes),
            ("grpc.max_send_message_length", self.limits.max_response_bytes + slack),
            ("grpc.max_connection_idle_ms", int(self.limits.idle_timeout_s * 1000)),
            ("grpc.so_reuseport", 0),
        ])
        server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE, self._handlers()),))
        if self._credentials is not None:
            self.port = server.add_secure_port(self._address, self._credentials)
        else:
            self.port = server.add_insecure_port(self._address)
        await server.start()
        self._server = server
        log.info("local inference gRPC API on %s:%d", self._host, self.port)

    async def stop(self) -> None:
        """Stop serving; calls in progress are cancelled."""
        if self._server is not None:
            await self._server.stop(grace=None)

    @property
    def target(self) -> str:
        """``host:port`` as a client dials it."""
        return f"[{self._host}]:{self.port}" if ":" in self._host else f"{self._host}:{self.port}"

    # -- handlers ---------------------------------------------------------------------------------

    def _handlers(self) -> dict[str, Any]:
        unary: list[tuple[str, Callable[[Any], Awaitable[Any]], Any]] = [
            ("ServerLive", self._server_live, pb.ServerLiveRequest),
            ("ServerReady", self._server_ready, pb.ServerReadyRequest),
            ("ModelReady", self._model_ready, pb.ModelReadyRequest),
            ("ServerMetadata", self._server_metadata, pb.ServerMetadataRequest),
            ("ModelMetadata", self._model_metadata, pb.ModelMetadataRequest),
            ("ModelInfer", self._model_infer, pb.ModelInferRequest),
            ("RepositoryIndex", self._repository_index, pb.RepositoryIndexRequest),
        ]
        handlers = {name: grpc.unary_unary_rpc_method_handler(
            self._guard(name, method), request_deserializer=kind.FromString,
            response_serializer=_serialize) for name, method, kind in unary}
        handlers["ModelStreamInfer"] = grpc.stream_stream_rpc_method_handler(
            self._model_stream_infer, request_deserializer=pb.ModelInferRequest.FromString, response_serializer=_serialize)
        return handlers

    def _guard(self, rpc: str, method: Callable[[Any], Awaitable[Any]]) -> Callable[[Any, Any], Awaitable[Any]]:
        """``method`` behind the access check, every failure turned into a gRPC status."""
        async def call(request: Any, context: Any) -> Any:
            try:
                self._check_access(rpc, context)
                return await method(request)
            except _Refusal as refusal:
                await context.abort(refusal.code, str(refusal))
            except Exception as exc:
                kind, message = describe_failure(exc)
                await context.abort(_STATUS[kind], message)

        return call

    def _check_access(self, rpc: str, context: Any) -> None:
        if rpc in OPEN_RPCS or self.access.token is None:
            return
        metadata = dict(context.invocation_metadata() or ())
        if not self.access.permits(metadata.get("authorization")):
            raise _Refusal(grpc.StatusCode.UNAUTHENTICATED, "missing or wrong bearer token in the authorization metadata")

    async def _server_live(self, _: pb.ServerLiveRequest) -> pb.ServerLiveResponse:
        return pb.ServerLiveResponse(live=True)

    async def _server_ready(self, _: pb.ServerReadyRequest) -> pb.ServerReadyResponse:
        return pb.ServerReadyResponse(ready=bool(self.pool.registry.names()))

    async def _model_ready(self, request: pb.ModelReadyRequest) -> pb.ModelReadyResponse:
        entry = self.pool.registry.get(request.name)
        check_version(entry.name, entry.version, request.version)
        return pb.ModelReadyResponse(ready=True)

    async def _server_metadata(self, _: pb.ServerMetadataRequest) -> pb.ServerMetadataResponse:
        return pb.ServerMetadataResponse(name="edge-agent", version=__version__)

    async def _model_metadata(self, request: pb.ModelMetadataRequest) -> pb.ModelMetadataResponse:
        entry = self.pool.registry.get(request.name)
        check_version(entry.name, entry.version, request.version)
        return pb.ModelMetadataResponse(
            name=entry.name, versions=[entry.version], platform=platform_of(entry.runner.name),
            inputs=[tensor_metadata(spec) for spec in entry.inputs],
            outputs=[tensor_metadata(spec) for spec in entry.outputs])

    async def _repository_index(self, request: pb.RepositoryIndexRequest) -> pb.RepositoryIndexResponse:
        models = self.pool.registry.telemetry()
        return pb.RepositoryIndexResponse(models=[
            pb.RepositoryIndexResponse.ModelIndex(name=name, version=str(data["version"]), state="READY")
            for name, data in sorted(models.items())])

    async def _model_infer(self, request: pb.ModelInferRequest) -> pb.ModelInferResponse:
        reserved = self._reserve(request)
        try:
            return await self.pool.run(request.model_name, request.model_version, _decoder(request), _encode)
        except QueueFull as exc:
            raise _Refusal(grpc.StatusCode.RESOURCE_EXHAUSTED, str(exc)) from None
        finally:
            self.pool.budget.release(reserved)

    async def _model_stream_infer(self, requests: AsyncIterator[pb.ModelInferRequest],
                                  context: Any) -> AsyncIterator[pb.ModelStreamInferResponse]:
        try:
            self._check_access("ModelStreamInfer", context)
        except _Refusal as refusal:
            await context.abort(refusal.code, str(refusal))
        async for request in requests:
            try:
                answer = await self._model_infer(request)
            except Exception as exc:
                message = str(exc) if isinstance(exc, _Refusal) else describe_failure(exc)[1]
                yield pb.ModelStreamInferResponse(error_message=message)
            else:
                yield pb.ModelStreamInferResponse(infer_response=answer)

    def _reserve(self, request: pb.ModelInferRequest) -> int:
        """Hold the request's memory in the shared budget (typed contents weigh as JSON does)."""
        cost = int(request.ByteSize()) + JSON_WEIGHT * typed_bytes(request)
        if cost > self.pool.budget.limit:
            raise _Refusal(grpc.StatusCode.RESOURCE_EXHAUSTED,
                           f"request would hold {cost} bytes while decoding (typed contents count {JSON_WEIGHT}x on top "
                           f"of their own size) and "
                           f"the in-flight limit is {self.pool.budget.limit}: send large tensors in raw_input_contents")
        if not self.pool.budget.try_reserve(cost):
            raise _Refusal(grpc.StatusCode.RESOURCE_EXHAUSTED, "too many bytes in flight; retry later")
        return cost


def _decoder(request: pb.ModelInferRequest) -> Callable[[PublishedModel], InferRequest]:
    return lambda entry: decode_infer(request, entry.inputs)


def _encode(entry: PublishedModel, results: dict[str, np.ndarray], decoded: InferRequest) -> pb.ModelInferResponse:
    return encode_infer(entry.name, entry.version, results, decoded)


def _serialize(message: Any) -> bytes:
    return bytes(message.SerializeToString())


def _credentials(tls: TlsFiles) -> Any:
    cert, key, ca = tls.read()
    return grpc.ssl_server_credentials([(key, cert)], root_certificates=ca, require_client_auth=ca is not None)

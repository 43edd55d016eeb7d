"""The inference work HTTP and gRPC share: the worker threads, their queue, the byte budget, one request's run.

Inference runs on a fixed pool of ``workers`` threads behind a queue of at most ``max_queue``
requests, whichever protocol they came by; a request that finds the queue full is refused
(HTTP 503, gRPC ``RESOURCE_EXHAUSTED``). Outputs whose size the input shapes determine are
forecast before the model runs and refused above ``max_response_bytes``.
"""

from __future__ import annotations

import asyncio
import enum
import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np

from agent.serving.budget import ByteBudget
from agent.serving.kserve import InferRequest, runtime_feeds
from agent.serving.memory import forecast_output_bytes
from agent.serving.published import ModelRegistry, PublishedModel
from edgecore.backends.base import TensorSpec
from edgecore.errors import EdgeError, NotFoundError, UserError
from edgecore.memory_limit import is_out_of_memory

__all__ = ["JSON_WEIGHT", "Failure", "InferencePool", "QueueFull", "ServingLimits", "check_version", "describe_failure"]

log = logging.getLogger(__name__)

JSON_WEIGHT = 8  # a JSON number of ~4 characters becomes a 32-byte Python float while decoding

R = TypeVar("R")
Decode = Callable[[PublishedModel], InferRequest]
Encode = Callable[[PublishedModel, dict[str, np.ndarray], InferRequest], R]


@dataclass(frozen=True)
class ServingLimits:
    """Concurrency and memory bounds of the server (configs/agent.yaml ``inference.*``)."""

    workers: int = 4
    max_queue: int = 64
    max_inflight_bytes: int = 256 * 2**20
    max_response_bytes: int = 64 * 2**20


class QueueFull(Exception):
    """Every worker is busy and the queue is full: the client should retry later."""


class Failure(str, enum.Enum):
    """What kind of failure a request met, for each protocol to map to its own status."""

    NOT_FOUND = "not_found"
    INVALID = "invalid"
    INTERNAL = "internal"


def describe_failure(exc: Exception) -> tuple[Failure, str]:
    """The kind and the one-line message of a request's failure (runtime bugs are logged)."""
    if isinstance(exc, NotFoundError):
        return Failure.NOT_FOUND, str(exc)
    if isinstance(exc, UserError):
        return Failure.INVALID, str(exc)
    if isinstance(exc, EdgeError):
        return Failure.INTERNAL, str(exc)
    if is_out_of_memory(exc):
        log.warning("inference ran out of memory: %s", str(exc).splitlines()[0][:200])
        return Failure.INTERNAL, "the model ran out of memory on this request; the server keeps serving"
    log.exception("request failed")
    return Failure.INTERNAL, f"internal error: {str(exc).splitlines()[0][:300] if str(exc) else type(exc).__name__}"


def check_version(name: str, published: str, asked: str | None) -> None:
    """NotFoundError unless ``asked`` is empty or the published version."""
    if asked and asked != published:
        raise NotFoundError(f"model '{name}' version '{asked}' is not published (serving '{published}')")


class InferencePool:
    """Runs inference requests for ``registry`` on ``limits.workers`` threads behind a bounded queue."""

    def __init__(self, registry: ModelRegistry, limits: ServingLimits) -> None:
        self.registry = registry
        self.limits = limits
        self.budget = ByteBudget(limits.max_inflight_bytes)
        self._threads = ThreadPoolExecutor(max_workers=limits.workers, thread_name_prefix="inference")
        self._pending = 0
        self._lock = threading.Lock()

    @property
    def pending(self) -> int:
        """Requests running or waiting for a worker."""
        return self._pending

    def queue_full(self) -> bool:
        """Whether one more request would be refused."""
        return self._pending >= self.limits.workers + self.limits.max_queue

    async def run(self, name: str, version: str | None, decode: Decode, encode: Encode[R]) -> R:
        """Decode, run and encode one request on a worker; QueueFull when there is no room."""
        with self._lock:
            if self.queue_full():
                raise QueueFull("inference queue is full; retry later")
            self._pending += 1
        try:
            return await asyncio.get_running_loop().run_in_executor(self._threads, self._infer, name, version, decode, encode)
        finally:
            with self._lock:
                self._pending -= 1

    def close(self) -> None:
        """Stop the workers (queued requests are cancelled)."""
        self._threads.shutdown(wait=False, cancel_futures=True)

    def _infer(self, name: str, version: str | None, decode: Decode, encode: Encode[R]) -> R:
        with self.registry.acquire(name) as entry:
            start = time.perf_counter()
            ok = False
            try:
                check_version(entry.name, entry.version, version)
                decoded = decode(entry)
                feeds = runtime_feeds(decoded.feeds)
                entry.runner.check_feeds(feeds)
                self._check_forecast(entry.inputs, entry.outputs, feeds)
                results = entry.runner.infer(feeds, check=False)
                self._check_size(results, decoded.outputs)
                answer = encode(entry, results, decoded)
                ok = True
                self.registry.remember_inputs(entry, feeds)
            finally:
                entry.stats.record(time.perf_counter() - start, ok)
        return answer

    def _check_forecast(self, inputs: list[TensorSpec], outputs: list[TensorSpec], feeds: dict[str, np.ndarray]) -> None:
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

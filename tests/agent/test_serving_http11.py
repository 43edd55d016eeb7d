"""HTTP/1.1 conformance of the agent's server (RFC 9110/9112), one raw-socket check per departure issue 23 found."""

from __future__ import annotations

import email.utils
import json
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from agent.config import InferenceSettings
from agent.serving import InferenceServer, ModelRegistry
from agent.serving.http11 import HttpLimits
from agent.serving.server import ServingLimits
from tests.agent.test_serving import ort_runner, scale_model
from tests.agent.test_serving_limits import GatedRunner

INFER = b"/v2/models/scale/infer"
BODY = json.dumps({"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 4], "data": [1, 2, 3, 4]},
                              {"name": "s", "datatype": "BYTES", "shape": [2], "data": ["a", "b"]}]}).encode()


@pytest.fixture(scope="module")
def registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ModelRegistry]:
    reg = ModelRegistry()
    reg.publish("scale", "1", ort_runner(scale_model(tmp_path_factory.mktemp("m") / "s.onnx", 2.0)))
    yield reg
    reg.close()


@pytest.fixture(scope="module")
def server(registry: ModelRegistry) -> Iterator[InferenceServer]:
    srv = InferenceServer(registry, max_request_bytes=1 << 20)
    srv.start()
    yield srv
    srv.stop()


def connect(server: InferenceServer) -> socket.socket:
    return socket.create_connection(("127.0.0.1", server.port), timeout=10)


def exchange(server: InferenceServer, data: bytes, wait_s: float = 10.0) -> bytes:
    """Send ``data`` and read until the server closes (or ``wait_s`` of silence)."""
    with connect(server) as sock:
        sock.sendall(data)
        return read_until_close(sock, wait_s)


def read_until_close(sock: socket.socket, wait_s: float = 10.0) -> bytes:
    sock.settimeout(wait_s)
    out = b""
    try:
        while chunk := sock.recv(65536):
            out += chunk
    except TimeoutError:
        pass
    return out


class Responses:
    """Reads responses one at a time off a kept-alive socket (pipelined answers may arrive in one segment)."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.buffer = b""

    def _more(self) -> None:
        chunk = self.sock.recv(65536)
        assert chunk, f"connection closed after {self.buffer[:300]!r}"
        self.buffer += chunk

    def next(self) -> tuple[int, dict[str, str], bytes]:
        """Status, lower-case headers and body of the next response."""
        while b"\r\n\r\n" not in self.buffer:
            self._more()
        head, _, self.buffer = self.buffer.partition(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        headers = {k.lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
        length = int(headers.get("content-length", "0"))
        while len(self.buffer) < length:
            self._more()
        body, self.buffer = self.buffer[:length], self.buffer[length:]
        return int(lines[0].split()[1]), headers, body


def status_of(raw: bytes) -> int:
    assert raw.startswith(b"HTTP/1.1 "), raw[:200]
    return int(raw.split()[1])


def request(method: bytes, target: bytes, headers: list[bytes], body: bytes = b"", version: bytes = b"HTTP/1.1") -> bytes:
    return b"\r\n".join([method + b" " + target + b" " + version, *headers, b"", body])


def test_every_response_carries_a_date(server: InferenceServer) -> None:
    raw = exchange(server, request(b"GET", b"/v2/health/live", [b"Host: x", b"Connection: close"]))
    date = next(line for line in raw.split(b"\r\n") if line.startswith(b"Date: "))[6:].decode()
    assert abs(email.utils.parsedate_to_datetime(date).timestamp() - time.time()) < 5
    assert date.endswith(" GMT")


def chunked(body: bytes, size: int) -> bytes:
    parts = [b"%x\r\n%s\r\n" % (len(body[i:i + size]), body[i:i + size]) for i in range(0, len(body), size)]
    return b"".join(parts) + b"0\r\n\r\n"


def test_chunked_request_body_is_served_and_the_next_request_stays_framed(server: InferenceServer) -> None:
    with connect(server) as sock:
        sock.sendall(request(b"POST", INFER, [b"Host: x", b"Transfer-Encoding: chunked"], chunked(BODY, 7))
                     + request(b"GET", b"/v2/health/live", [b"Host: x"]))
        answers = Responses(sock)
        status, _, body = answers.next()
        assert status == 200 and json.loads(body)["outputs"][0]["data"] == [2, 4, 6, 8]
        status, _, body = answers.next()
        assert status == 200 and json.loads(body) == {"live": True}


def test_chunked_body_over_max_request_bytes_is_413(registry: ModelRegistry) -> None:
    server = InferenceServer(registry, http=HttpLimits(max_request_bytes=len(BODY) - 1))
    server.start()
    try:
        raw = exchange(server, request(b"POST", INFER, [b"Host: x", b"Transfer-Encoding: chunked"], chunked(BODY, 16)))
        assert status_of(raw) == 413 and b"chunked request exceeds the limit of" in raw
    finally:
        server.stop()


def test_chunked_body_is_held_in_the_inflight_budget_as_it_arrives(registry: ModelRegistry) -> None:
    server = InferenceServer(registry, limits=ServingLimits(max_inflight_bytes=10_000))
    server.start()
    try:
        with connect(server) as sock:
            sock.sendall(request(b"POST", INFER, [b"Host: x", b"Transfer-Encoding: chunked"], b"1f40\r\n" + b"x" * 8000))
            deadline = time.monotonic() + 5
            while server.budget.used < 8000 and time.monotonic() < deadline:
                time.sleep(0.02)
            assert server.budget.used == 8000
            sock.sendall(b"\r\n" + b"1f40\r\n" + b"x" * 8000 + b"\r\n")  # a second 8000-byte chunk does not fit
            raw = read_until_close(sock)
        assert status_of(raw) == 503 and b"too many bytes in flight" in raw
        assert server.budget.used == 0
    finally:
        server.stop()


def test_expect_100_continue_is_answered_before_the_body(server: InferenceServer) -> None:
    with connect(server) as sock:
        sock.sendall(request(b"POST", INFER, [b"Host: x", b"Expect: 100-continue", b"Content-Length: %d" % len(BODY)]))
        sock.settimeout(5)
        interim = sock.recv(100)
        assert interim == b"HTTP/1.1 100 Continue\r\n\r\n"
        sock.sendall(BODY)
        status, _, body = Responses(sock).next()
        assert status == 200 and json.loads(body)["outputs"][0]["data"] == [2, 4, 6, 8]


def test_expect_100_continue_gets_the_refusal_at_once_when_not_admitted(registry: ModelRegistry, tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text("s3cret-token-0123456789\n")
    server = InferenceServer.from_settings(registry, InferenceSettings(port=0, token_file=token, memory_limit_mb=0))
    server.start()
    try:
        with connect(server) as sock:  # no token: refused before the client sends its body
            sock.sendall(request(b"POST", INFER, [b"Host: x", b"Expect: 100-continue", b"Content-Length: %d" % len(BODY)]))
            started = time.monotonic()
            raw = read_until_close(sock)
        assert status_of(raw) == 401 and b"Connection: close" in raw and time.monotonic() - started < 3
    finally:
        server.stop()


def test_expect_100_continue_too_large_is_413_at_once(registry: ModelRegistry) -> None:
    server = InferenceServer(registry, http=HttpLimits(max_request_bytes=1000))
    server.start()
    try:
        raw = exchange(server, request(b"POST", INFER, [b"Host: x", b"Expect: 100-continue", b"Content-Length: 5000"]), 3)
        assert status_of(raw) == 413 and b"100 Continue" not in raw
    finally:
        server.stop()


@pytest.mark.parametrize(("headers", "version", "status"), [
    ([], b"HTTP/1.1", 400),
    ([b"Host: a", b"Host: b"], b"HTTP/1.1", 400),
    ([b"Host: a", b"Host: a"], b"HTTP/1.0", 400),
    ([], b"HTTP/1.0", 200),  # HTTP/1.0 clients need not send Host
])
def test_host_must_appear_exactly_once_in_http11(server: InferenceServer, headers: list[bytes], version: bytes,
                                                 status: int) -> None:
    raw = exchange(server, request(b"GET", b"/v2/health/live", [*headers, b"Connection: close"], version=version))
    assert status_of(raw) == status, raw[:300]
    if status == 400:
        assert b"exactly one Host header" in raw


@pytest.mark.parametrize("lengths", [(b"5", b"0"), (b"5", b"5"), (b"5, 0",)])
def test_differing_or_repeated_content_lengths_are_400_and_nothing_is_smuggled(server: InferenceServer,
                                                                               lengths: tuple[bytes, ...]) -> None:
    smuggled = request(b"GET", b"/v2/health/live", [b"Host: x"])
    headers = [b"Host: x", *(b"Content-Length: " + n for n in lengths)]
    raw = exchange(server, request(b"POST", INFER, headers, b"hello" + smuggled))
    assert status_of(raw) == 400 and raw.count(b"HTTP/1.1 ") == 1, raw  # one answer: the tail is not a request


@pytest.mark.parametrize("header", ["Content-Length", "Inference-Header-Content-Length"])
def test_a_non_ascii_digit_length_is_400_not_a_dropped_connection(server: InferenceServer, header: str) -> None:
    headers = [b"Host: x", f"{header}: ²".encode()]
    if header != "Content-Length":
        headers.append(b"Content-Length: %d" % len(BODY))
    raw = exchange(server, request(b"POST", INFER, [*headers, b"Connection: close"], BODY))
    assert status_of(raw) == 400, raw[:300]
    assert (b"Content-Length" in raw) and b"Traceback" not in raw


@pytest.mark.parametrize(("version", "status"), [(b"HTTP/1.x", 400), (b"HTTP/1.2", 400), (b"HTTP/2.0", 505)])
def test_bad_http_versions_are_refused(server: InferenceServer, version: bytes, status: int) -> None:
    raw = exchange(server, request(b"GET", b"/v2/health/live", [b"Host: x"], version=version))
    assert status_of(raw) == status, raw[:300]


@pytest.mark.parametrize("head", [
    request(b"GET", b"/v2/health/li\x7fve", [b"Host: x"]),  # DEL in the target
    request(b"GET", b"/v2/health/live", [b"Host: x", b"X Pad: 1"]),  # a space inside a field name
    request(b"GET", b"/v2/health/live", [b"Host : x"]),  # a space before the colon
    request(b"GET", b"/v2/health/live", [b"Host: x", b"X-Pad: a\x00b"]),  # NUL in a value
])
def test_bad_bytes_in_the_head_are_400(server: InferenceServer, head: bytes) -> None:
    raw = exchange(server, head)
    assert status_of(raw) == 400 and b"malformed request" in raw, raw[:300]


def test_absolute_form_target_is_served(server: InferenceServer) -> None:
    target = b"http://127.0.0.1:%d/v2/health/live" % server.port
    raw = exchange(server, request(b"GET", target, [b"Host: 127.0.0.1", b"Connection: close"]))
    assert status_of(raw) == 200 and raw.endswith(b'{"live":true}')


def test_http10_keep_alive_is_answered_as_such(server: InferenceServer) -> None:
    with connect(server) as sock:
        answers = Responses(sock)
        for _ in range(2):
            sock.sendall(request(b"GET", b"/v2/health/live", [b"Connection: keep-alive"], version=b"HTTP/1.0"))
            status, headers, _ = answers.next()
            assert status == 200 and headers["connection"] == "keep-alive"
    raw = exchange(server, request(b"GET", b"/v2/health/live", [], version=b"HTTP/1.0"))  # 1.0 default: close
    assert status_of(raw) == 200 and b"Connection: close" in raw


def test_transfer_codings_other_than_chunked_are_501(server: InferenceServer) -> None:
    raw = exchange(server, request(b"POST", INFER, [b"Host: x", b"Transfer-Encoding: gzip, chunked"], b"0\r\n\r\n"))
    assert status_of(raw) == 501, raw[:300]


def test_pipelined_requests_are_answered_in_order(server: InferenceServer) -> None:
    one = request(b"POST", INFER, [b"Host: x", b"Content-Length: %d" % len(BODY)], BODY)
    last = request(b"GET", b"/v2/health/ready", [b"Host: x", b"Connection: close"])
    raw = exchange(server, one * 3 + last)
    assert raw.count(b"HTTP/1.1 200 OK") == 4 and raw.endswith(b'{"ready":true}'), raw[-300:]


def test_content_length_beside_transfer_encoding_is_400(server: InferenceServer) -> None:
    smuggled = request(b"GET", b"/v2/health/live", [b"Host: x"])
    headers = [b"Host: x", b"Content-Length: 5", b"Transfer-Encoding: chunked"]
    raw = exchange(server, request(b"POST", INFER, headers, b"0\r\n\r\n" + smuggled))
    assert status_of(raw) == 400 and raw.count(b"HTTP/1.1 ") == 1, raw


def test_an_expectation_other_than_100_continue_is_417(server: InferenceServer) -> None:
    raw = exchange(server, request(b"POST", INFER, [b"Host: x", b"Expect: something-else", b"Content-Length: 0"]))
    assert status_of(raw) == 417, raw[:300]


def test_an_upgrade_offer_is_ignored_and_the_request_served(server: InferenceServer) -> None:
    headers = [b"Host: x", b"Connection: Upgrade, close", b"Upgrade: h2c"]
    raw = exchange(server, request(b"GET", b"/v2/health/live", headers))
    assert status_of(raw) == 200 and raw.endswith(b'{"live":true}'), raw[:300]


def test_a_held_pipelined_answer_leaves_before_a_slow_inference_starts(tmp_path: Path) -> None:
    """Answers to pipelined GETs may wait to leave in one write, but never behind an inference."""
    registry = ModelRegistry()
    gated = GatedRunner(ort_runner(scale_model(tmp_path / "g.onnx", 2.0)))
    registry.publish("scale", "1", gated)
    server = InferenceServer(registry)
    server.start()
    try:
        with connect(server) as sock:
            live = request(b"GET", b"/v2/health/live", [b"Host: x"])
            sock.sendall(live + live + request(b"POST", INFER, [b"Host: x", b"Content-Length: %d" % len(BODY)], BODY))
            assert gated.entered.acquire(timeout=10)  # the inference runs, held at the gate (10 s at most)
            sock.settimeout(5)  # the GETs' answers must come while it is held, not after
            answers = Responses(sock)
            assert [answers.next()[0] for _ in range(2)] == [200, 200]
            gated.gate.set()
            status, _, body = answers.next()
            assert status == 200 and json.loads(body)["outputs"][0]["data"] == [2, 4, 6, 8]
    finally:
        gated.gate.set()
        server.stop()
        registry.close()

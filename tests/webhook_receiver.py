"""A real HTTP receiver of webhook deliveries that checks each signature with the code docs/integrations.md shows."""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from tests.checkout import REPO

__all__ = ["Hit", "Receiver", "Verify", "docs_verify"]

Verify = Callable[[str, Mapping[str, str], bytes], bool]


def docs_verify() -> Verify:
    """The receiver's check, exactly as docs/integrations.md prints it."""
    text = (REPO / "docs" / "integrations.md").read_text()
    found = re.search(r"```python\n(.*?)```", text, re.S)
    assert found is not None, "docs/integrations.md lost its verification snippet"
    namespace: dict[str, object] = {}
    exec(compile(found.group(1), "docs/integrations.md", "exec"), namespace)  # our own docs' code, under test
    verify = namespace["verify"]
    assert callable(verify)
    return verify


@dataclass
class Hit:
    at: float
    headers: dict[str, str]
    body: bytes
    verified: bool


@dataclass
class Receiver:
    """A real HTTP server: each POST verified with ``secret``, answered with the next of ``answers`` (the last repeats);
    a POST that fails verification gets 401."""

    secret: str
    answers: list[int]
    verify: Verify = field(default_factory=docs_verify)
    hits: list[Hit] = field(default_factory=list)
    location: str = ""  # a 3xx answer's Location
    trickle_s: float = 0.0  # answer one byte at a time, this long apart (each read answered, the whole too slow)

    def __post_init__(self) -> None:
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                ok = receiver.verify(receiver.secret, dict(self.headers), body)
                receiver.hits.append(Hit(time.monotonic(), dict(self.headers), body, ok))
                if receiver.trickle_s:
                    return self.trickle()
                status = (receiver.answers.pop(0) if len(receiver.answers) > 1 else receiver.answers[0]) if ok else 401
                self.send_response(status)
                if receiver.location:
                    self.send_header("Location", receiver.location)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def trickle(self) -> None:
                try:
                    for byte in b"HTTP/1.1 200 OK\r\n" + b"X-Slow: " + b"." * 200:
                        self.wfile.write(bytes([byte]))
                        self.wfile.flush()
                        time.sleep(receiver.trickle_s)
                except OSError:
                    pass  # the sender hung up: what the test wants

            def log_message(self, *_args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, args=(0.05,), daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/hook"

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()

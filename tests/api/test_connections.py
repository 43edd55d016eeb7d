"""HTTP connections and store connections of a real API server (in process, on a real store of each engine)."""

from __future__ import annotations

import http.client
import json
import socket
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from edgectl.api import Accounts, ApiServer, api_context, api_routes
from edgectl.config import EdgectlConfig
from edgectl.controller.accounts import Role
from edgectl.controller.store import Store, open_url
from edgectl.controller.store.sql import IDLE_CONNECTIONS
from tests.api.conftest import ENGINES
from tests.fleet import wait_for
from tests.postgres import PostgresCluster


class Served:
    def __init__(self, store: Store, url: str) -> None:
        self.store, self.store_url = store, url
        ctx = api_context(store, EdgectlConfig())
        Accounts(store).add_user("ann", Role.ADMIN, "test")
        self.token = Accounts(store).create_token("ann", "", None, "test")[1]
        self.server = ApiServer(ctx, api_routes(ctx), "127.0.0.1", 0).start()
        self.port = int(self.server.url.rsplit(":", 1)[1])

    @property
    def auth(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token}"}


@pytest.fixture(params=ENGINES)
def served(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Served]:
    url = str(tmp_path / "controller.db")
    if request.param == "postgres":
        cluster: PostgresCluster = request.getfixturevalue("postgres")
        url = cluster.create_database()
    store = open_url(url, packages_dir=tmp_path / "cache")
    plane = Served(store, url)
    yield plane
    plane.server.stop()
    store.close()


def test_a_body_left_unread_closes_the_connection(served: Served) -> None:
    """A route that takes no body (pause) and a refused chunked body: the next request on the connection is
    answered as itself, not read from the leftover body ('{}GET ...' -> 501)."""
    conn = http.client.HTTPConnection("127.0.0.1", served.port, timeout=30)
    conn.request("POST", "/api/v1/rollouts/r-none/pause", body=b"{}",
                 headers={**served.auth, "Content-Type": "application/json"})
    answer = conn.getresponse()
    assert (answer.status, answer.getheader("Connection")) == (404, "close")
    answer.read()
    conn.request("GET", "/api/v1/me", headers=served.auth)
    again = conn.getresponse()
    assert again.status == 200 and json.loads(again.read())["user"] == "ann"
    # The chunked request in one write: the server may answer and close as soon as it has read the head, and a
    # client still sending its chunks then gets EPIPE (http.client sends the last chunk on its own).
    head = "".join(f"{k}: {v}\r\n" for k, v in {**served.auth, "Host": "127.0.0.1", "Content-Type": "application/json",
                                                "Transfer-Encoding": "chunked"}.items())
    with socket.create_connection(("127.0.0.1", served.port), timeout=30) as raw:
        raw.sendall(f"POST /api/v1/rollouts HTTP/1.1\r\n{head}\r\n".encode() + b"2\r\n{}\r\n0\r\n\r\n")
        chunked = http.client.HTTPResponse(raw)
        chunked.begin()
        assert (chunked.status, chunked.getheader("Connection")) == (411, "close")
        chunked.read()
        assert raw.recv(1) == b""  # closed: nothing of the body is read as a next request
    conn.request("GET", "/api/v1/me", headers=served.auth)
    assert conn.getresponse().status == 200
    conn.close()


def test_a_read_body_keeps_the_connection(served: Served) -> None:
    conn = http.client.HTTPConnection("127.0.0.1", served.port, timeout=30)
    conn.request("POST", "/api/v1/users", body=json.dumps({"name": "bob", "role": "viewer"}).encode(),
                 headers={**served.auth, "Content-Type": "application/json"})
    answer = conn.getresponse()
    assert answer.status == 201 and answer.getheader("Connection") is None
    answer.read()
    sock = conn.sock
    conn.request("GET", "/api/v1/users", headers=served.auth)
    assert conn.getresponse().status == 200 and conn.sock is sock  # the same connection carried both
    conn.close()


@pytest.mark.parametrize("served", ["postgres"], indirect=True)
def test_request_threads_give_their_store_connections_back(served: Served) -> None:
    """Each HTTP connection has a thread of its own; the store connections it opened go back to an idle pool
    when it ends, so 60 short connections do not leave 60 PostgreSQL connections open."""
    import psycopg

    def connections() -> int:
        with psycopg.connect(served.store_url) as db:
            row = db.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()").fetchone()
            return int(row[0]) - 1 if row else 0  # not this one

    before = connections()
    for _ in range(60):
        request = urllib.request.Request(f"http://127.0.0.1:{served.port}/api/v1/devices", headers=served.auth)
        with urllib.request.urlopen(request, timeout=30) as answer:
            assert answer.status == 200
    wait_for(lambda: connections() <= before + 2 * IDLE_CONNECTIONS, 30, "store connections given back")

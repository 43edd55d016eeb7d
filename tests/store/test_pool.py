"""The PostgreSQL store's bounded connection pool, in process: its ``connect`` seam opens fake connections.

A pool whose every slot holds an idle connection of one kind (``db``) must still serve the other kind
(``observed``): it closes an idle one and takes its slot. Before, ``take('observed')`` waited ``wait_s`` and
failed with StoreUnavailable, so every device write of a process whose pool had filled up with idle read
connections (API threads) stalled, then failed. ``wait_s`` is 0 here: a pool that would wait fails at once.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from edgectl.controller.store.pool import ConnectionPool
from edgectl.controller.store.protocol import StoreUnavailable


@dataclass
class FakeConnection:
    kind: str
    number: int
    closed: bool = False
    broken: bool = False

    def close(self) -> None:
        self.closed = True


@dataclass
class Opened:
    """The pool's ``connect``: every connection it opened, in order."""

    every: list[FakeConnection] = field(default_factory=list)

    def __call__(self, kind: str) -> FakeConnection:
        conn = FakeConnection(kind, len(self.every))
        self.every.append(conn)
        return conn


def _pool(size: int) -> tuple[ConnectionPool, Opened]:
    opened = Opened()
    return ConnectionPool(opened, size, 0.0, "test"), opened


def test_a_pool_full_of_idle_connections_of_one_kind_closes_one_for_the_other_kind() -> None:
    pool, opened = _pool(2)
    first, second = pool.take("db"), pool.take("db")
    pool.give(first, "db", keep=True)
    pool.give(second, "db", keep=True)
    observed = pool.take("observed")  # raised StoreUnavailable (all 2 connections in use) before the fix
    assert observed.kind == "observed" and not observed.closed
    assert [c.closed for c in (first, second)] == [True, False]  # the one idle longest went; the other is kept
    assert pool.open_count == 2 and len(opened.every) == 3  # within the size: one closed, one opened
    assert pool.take("db") is second  # the kept one is handed out again


def test_a_free_slot_is_used_before_an_idle_connection_of_another_kind_is_closed() -> None:
    pool, opened = _pool(3)
    idle = [pool.take("db"), pool.take("db")]
    for conn in idle:
        pool.give(conn, "db", keep=True)
    pool.take("observed")
    assert not any(c.closed for c in idle) and pool.open_count == 3 and len(opened.every) == 3


def test_connections_in_use_are_never_taken_and_the_pool_still_refuses_past_its_size() -> None:
    pool, opened = _pool(2)
    busy = [pool.take("db"), pool.take("db")]  # held by their threads: not idle
    with pytest.raises(StoreUnavailable, match="all 2 connections of this process in use"):
        pool.take("observed")
    assert not any(c.closed for c in busy) and pool.open_count == 2 and len(opened.every) == 2


def test_an_idle_connection_of_its_own_kind_is_reused_rather_than_one_of_another_closed() -> None:
    pool, opened = _pool(2)
    db, observed = pool.take("db"), pool.take("observed")
    pool.give(db, "db", keep=True)
    pool.give(observed, "observed", keep=True)
    assert pool.take("observed") is observed and not db.closed and len(opened.every) == 2

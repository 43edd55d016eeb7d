"""Every store test runs on both back-ends: SQLite in the test's directory, PostgreSQL in a cluster of its own."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from edgectl.controller.store import Retention, Store, open_url
from tests.postgres import PostgresCluster, start_cluster

MakeStore = Callable[..., Store]


@pytest.fixture(scope="session")
def postgres() -> Iterator[PostgresCluster]:
    cluster = start_cluster()
    yield cluster
    cluster.stop()


@pytest.fixture(params=["sqlite", "postgres"])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return str(tmp_path / "store.db")
    cluster: PostgresCluster = request.getfixturevalue("postgres")
    return cluster.create_database()


@pytest.fixture
def make_store(store_url: str, tmp_path: Path) -> Iterator[MakeStore]:
    """Open the test's store (again: another process or replica would), with a retention if given."""
    opened: list[Store] = []

    def make(retention: Retention | None = None, cache: str = "cache") -> Store:
        store = open_url(store_url, retention, tmp_path / cache)
        opened.append(store)
        return store

    yield make
    for store in opened:
        store.close()


@pytest.fixture
def store(make_store: MakeStore) -> Store:
    return make_store()

"""The REST server's own guards in process: an empty package upload is refused before any package code reads it,
and only a store that is busy (SQLite locked or busy, psycopg's OperationalError) is worth a retry; any other
store error is a 500. ./scripts/mutants runs these for edgectl/api/server.py."""

from __future__ import annotations

import sqlite3

import psycopg
import pytest

from edgectl.api.server import ApiServer, _store_busy
from tests.guards.test_api_limits import _post, operator

__all__ = ["operator"]  # the fixture, shared with test_api_limits


def test_an_empty_upload_is_refused_and_one_byte_is_read(operator: tuple[ApiServer, str]) -> None:
    server, token = operator
    status, message = _post(server, token, "/api/v1/packages", {"Content-Length": "0"})
    assert (status, message) == (400, "body: empty; send the .edgepkg file as the request body")
    status, message = _post(server, token, "/api/v1/packages", {"Content-Length": "1"}, b"x")
    assert status == 400 and "body: empty" not in message  # read, then refused as no package


class OperationalError(Exception):
    """Named like psycopg's, but not psycopg's."""


@pytest.mark.parametrize(("exc", "busy"), [
    (sqlite3.OperationalError("database is locked"), True),
    (sqlite3.OperationalError("database table is busy"), True),
    (sqlite3.OperationalError("no such table: devices"), False),
    (sqlite3.IntegrityError("locked"), False),
    (psycopg.OperationalError("the server closed the connection"), True),
    (psycopg.errors.AdminShutdown("terminating connection"), True),  # a subclass of OperationalError
    (psycopg.errors.UniqueViolation("duplicate key"), False),
    (psycopg.InterfaceError("locked"), False),
    (OperationalError("busy"), False),
    (ValueError("locked"), False),
])
def test_only_a_busy_store_is_retried(exc: Exception, busy: bool) -> None:
    assert _store_busy(exc) is busy

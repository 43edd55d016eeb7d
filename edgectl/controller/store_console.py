"""What the console (REST API, metrics, ``edgectl users|tokens``) needs from the store, and its SQLite side.

:class:`ConsoleStore` lists the methods; :class:`SqliteConsole` implements them on the store's SQLite
file (its own tables: users, tokens, packages; the devices table for pages and counts). It works
standalone on the file or as a base of the SQLite store (which then passes its ``_db``).
:func:`console_store` gives the console view of any :class:`~edgectl.controller.store.Store`.
A PostgreSQL store implements the same methods with its own SQL (``birth::jsonb->>'target'``
where SQLite says ``json_extract(birth, '$.target')``).
"""

from __future__ import annotations

import json
import sqlite3
import threading
from pathlib import Path
from typing import Any, Protocol, cast

from agent.errors import ConfigError
from edgectl.controller.accounts import Role, TokenRow, UserRow
from edgectl.controller.queries import DevicePage, DeviceQuery, UploadedPackage
from edgectl.controller.records import DeviceRow, PackageRef

__all__ = ["CONSOLE_SCHEMA", "ConsoleStore", "SqliteConsole", "console_store"]

CONSOLE_SCHEMA = """
CREATE TABLE IF NOT EXISTS users(name TEXT PRIMARY KEY, role TEXT NOT NULL, created REAL);
CREATE TABLE IF NOT EXISTS tokens(
    id TEXT PRIMARY KEY, user TEXT NOT NULL, name TEXT, sha256 TEXT NOT NULL, created REAL, expires REAL, revoked REAL);
CREATE TABLE IF NOT EXISTS packages(variant TEXT PRIMARY KEY, ref TEXT NOT NULL, uploaded REAL, actor TEXT);
"""

_STATUS = "CASE online WHEN 1 THEN 'online' WHEN 0 THEN 'offline' ELSE 'unknown' END"
_FIELDS = {
    "id": "id",
    "target": "json_extract(birth, '$.target')",
    "model": "json_extract(state, '$.active.name')",
    "agent": "json_extract(birth, '$.agent_version')",
    "status": _STATUS,
}


def _like(value: str) -> str:
    return value.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")


def _where(query: DeviceQuery) -> tuple[str, list[Any]]:
    """The SQL condition for ``query``: selector terms, version, text."""
    clauses: list[str] = ["1=1"]
    args: list[Any] = []
    for key, want in query.terms:
        if key in _FIELDS:
            expr = _FIELDS[key]
        else:
            expr = "json_extract(birth, ?)"
            args.append(f'$.tags."{key}"')
        if want.endswith("*"):
            clauses.append(f"COALESCE(CAST({expr} AS TEXT), '') LIKE ? ESCAPE '\\'")
            args.append(_like(want[:-1]) + "%")
        else:
            clauses.append(f"COALESCE(CAST({expr} AS TEXT), '') = ?")
            args.append(want)
    if query.version is not None:
        clauses.append("json_extract(state, '$.active.version') = ?")
        args.append(query.version)
    if query.text:
        fields = ("id", _FIELDS["target"], _FIELDS["model"], "json_extract(birth, '$.tags')")
        clauses.append("(" + " OR ".join(f"COALESCE({f}, '') LIKE ? ESCAPE '\\'" for f in fields) + ")")
        args += [f"%{_like(query.text)}%"] * len(fields)
    return " AND ".join(clauses), args


class ConsoleStore(Protocol):
    """The store methods the console adds to :class:`~edgectl.controller.store.Store`."""

    def device_page(self, query: DeviceQuery) -> DevicePage:
        """Devices matching ``query``, ordered by id, one page of them and the total count."""
    def device_tag_keys(self) -> set[str]: ...
    def device_counts(self) -> dict[tuple[str, str], int]: ...
    def device_models(self) -> dict[tuple[str, int | None], int]: ...
    def ingest_lags(self, since: float) -> list[float]: ...
    def add_user(self, user: UserRow) -> bool: ...
    def users(self) -> list[UserRow]: ...
    def user(self, name: str) -> UserRow | None: ...
    def remove_user(self, name: str, revoked: float) -> bool: ...
    def add_token(self, token: TokenRow) -> None: ...
    def tokens(self, user: str | None = None) -> list[TokenRow]: ...
    def token(self, token_id: str) -> TokenRow | None: ...
    def revoke_token(self, token_id: str, revoked: float) -> bool: ...
    def save_package(self, package: UploadedPackage) -> None: ...
    def packages(self) -> list[UploadedPackage]: ...


def console_store(store: object) -> ConsoleStore:
    """The console view of a store: the store itself when it implements it, else its SQLite file."""
    if all(callable(getattr(store, name, None)) for name in ("device_page", "add_token", "save_package")):
        return cast(ConsoleStore, store)
    path = getattr(store, "path", None)
    if isinstance(path, Path):
        return SqliteConsole(path)
    raise ConfigError(f"the store at {getattr(store, 'location', lambda: '?')()} has no users, tokens or package uploads "
                      "yet (the REST API needs the SQLite store, or a store engine that implements ConsoleStore)")


class SqliteConsole:
    """Console queries and tables on a SQLite store file (one connection per thread, WAL)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._local = threading.local()
        self._db().executescript(CONSOLE_SCHEMA)

    def _db(self) -> sqlite3.Connection:
        db: sqlite3.Connection | None = getattr(self._local, "db", None)
        if db is None:
            db = sqlite3.connect(self.path, timeout=30.0, isolation_level=None, check_same_thread=True)
            db.execute("PRAGMA journal_mode=WAL")
            db.row_factory = sqlite3.Row
            self._local.db = db
        return db

    # -- devices ------------------------------------------------------------------------------

    def device_page(self, query: DeviceQuery) -> DevicePage:
        where, args = _where(query)
        db = self._db()
        total = int(db.execute(f"SELECT COUNT(*) FROM devices WHERE {where}", args).fetchone()[0])
        rows = db.execute(f"SELECT * FROM devices WHERE {where} ORDER BY id LIMIT ? OFFSET ?",
                          [*args, query.limit, query.offset]).fetchall()
        return DevicePage([_device(r) for r in rows], total)

    def device_tag_keys(self) -> set[str]:
        rows = self._db().execute("SELECT DISTINCT j.key FROM devices, json_each(devices.birth, '$.tags') j "
                                  "WHERE json_type(devices.birth, '$.tags') = 'object'")
        return {str(r[0]) for r in rows}

    def device_counts(self) -> dict[tuple[str, str], int]:
        """Devices by (target, status online|offline|unknown)."""
        rows = self._db().execute(f"SELECT COALESCE(json_extract(birth, '$.target'), '') t, {_STATUS} s, COUNT(*) n "
                                  "FROM devices GROUP BY t, s")
        return {(str(r["t"]), str(r["s"])): int(r["n"]) for r in rows}

    def device_models(self) -> dict[tuple[str, int | None], int]:
        """Devices by active (model name, version); ("", None) for devices that serve nothing."""
        rows = self._db().execute("SELECT COALESCE(json_extract(state, '$.active.name'), '') m, "
                                  "json_extract(state, '$.active.version') v, COUNT(*) n FROM devices GROUP BY m, v")
        return {(str(r["m"]), None if r["v"] is None or r["m"] == "" else int(r["v"])): int(r["n"]) for r in rows}

    def ingest_lags(self, since: float) -> list[float]:
        """Seconds from each device's last telemetry report (its ``ts``) to the store, for reports since ``since``."""
        rows = self._db().execute("SELECT telemetry_ts - json_extract(telemetry, '$.ts') FROM devices "
                                  "WHERE telemetry_ts >= ? AND json_type(telemetry, '$.ts') IN ('real', 'integer')",
                                  (since,))
        return [float(r[0]) for r in rows]

    # -- users and tokens -----------------------------------------------------------------------

    def add_user(self, user: UserRow) -> bool:
        """Add ``user``; False when the name is taken."""
        cursor = self._db().execute("INSERT OR IGNORE INTO users VALUES (?,?,?)", (user.name, user.role.value, user.created))
        return cursor.rowcount == 1

    def users(self) -> list[UserRow]:
        rows = self._db().execute("SELECT * FROM users ORDER BY name")
        return [UserRow(r["name"], Role(r["role"]), r["created"]) for r in rows]

    def user(self, name: str) -> UserRow | None:
        r = self._db().execute("SELECT * FROM users WHERE name=?", (name,)).fetchone()
        return UserRow(r["name"], Role(r["role"]), r["created"]) if r else None

    def remove_user(self, name: str, revoked: float) -> bool:
        """Remove the user and revoke its tokens; False when there is no such user."""
        db = self._db()
        db.execute("UPDATE tokens SET revoked=? WHERE user=? AND revoked IS NULL", (revoked, name))
        return db.execute("DELETE FROM users WHERE name=?", (name,)).rowcount == 1

    def add_token(self, token: TokenRow) -> None:
        self._db().execute("INSERT INTO tokens VALUES (?,?,?,?,?,?,?)", (token.id, token.user, token.name, token.sha256,
                                                                         token.created, token.expires, token.revoked))

    def tokens(self, user: str | None = None) -> list[TokenRow]:
        sql, args = ("SELECT * FROM tokens WHERE user=? ORDER BY created", (user,)) if user else \
            ("SELECT * FROM tokens ORDER BY created", ())
        return [_token(r) for r in self._db().execute(sql, args)]

    def token(self, token_id: str) -> TokenRow | None:
        r = self._db().execute("SELECT * FROM tokens WHERE id=?", (token_id,)).fetchone()
        return _token(r) if r else None

    def revoke_token(self, token_id: str, revoked: float) -> bool:
        """Revoke one token; False when there is no such token or it was revoked already."""
        cursor = self._db().execute("UPDATE tokens SET revoked=? WHERE id=? AND revoked IS NULL", (revoked, token_id))
        return cursor.rowcount == 1

    # -- uploaded packages ----------------------------------------------------------------------

    def save_package(self, package: UploadedPackage) -> None:
        self._db().execute("INSERT OR REPLACE INTO packages VALUES (?,?,?,?)", (
            package.ref.variant, json.dumps(package.ref.to_dict()), package.uploaded, package.actor))

    def packages(self) -> list[UploadedPackage]:
        rows = self._db().execute("SELECT * FROM packages ORDER BY uploaded")
        return [UploadedPackage(PackageRef.from_dict(json.loads(r["ref"])), r["uploaded"], r["actor"] or "") for r in rows]


def _device(r: sqlite3.Row) -> DeviceRow:
    return DeviceRow(r["id"], None if r["online"] is None else bool(r["online"]), r["last_seen"],
                     json.loads(r["birth"] or "{}"), json.loads(r["state"] or "{}"), json.loads(r["telemetry"] or "{}"),
                     r["telemetry_ts"])


def _token(r: sqlite3.Row) -> TokenRow:
    return TokenRow(r["id"], r["user"], r["name"] or "", r["sha256"], r["created"], r["expires"], r["revoked"])

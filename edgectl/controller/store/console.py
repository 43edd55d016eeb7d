"""The console's queries (:class:`~edgectl.controller.store.protocol.ConsoleStore`), written once for both engines.

Device pages and counts are filtered, counted and paged in SQL: decoding 10,000 device rows in Python
to filter them costs about half a second. The only difference between the engines is how a JSON field
of a text column is read, which each back-end supplies: SQLite ``json_extract(birth, '$.target')``,
PostgreSQL ``birth::jsonb #>> '{target}'`` (and ILIKE, since SQLite's LIKE ignores ASCII case).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from edgectl.controller.accounts import Role, TokenRow, UserRow
from edgectl.controller.queries import DevicePage, DeviceQuery, UploadedPackage
from edgectl.controller.records import DeviceRow, PackageRef

__all__ = ["ConsoleSql"]

STATUS = "CASE online WHEN 1 THEN 'online' WHEN 0 THEN 'offline' ELSE 'unknown' END"
FIELDS = {"target": ("birth", "target"), "model": ("state", "active.name"), "agent": ("birth", "agent_version")}


def _like(value: str) -> str:
    return value.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")


class ConsoleSql:
    """Console queries on the store's tables; a back-end supplies the JSON hooks and ``_all`` / ``_execute``."""

    like = "LIKE"

    # -- hooks ------------------------------------------------------------------------------------

    def _json(self, column: str, path: str) -> str:
        """SQL text reading the JSON field at ``path`` (a constant: ``active.name``) of a text column, as text."""
        raise NotImplementedError

    def _json_tag(self, key: str) -> tuple[str, Any]:
        """SQL text with one ``?`` reading the device tag ``key`` from ``birth``, and the value for the ``?``."""
        raise NotImplementedError

    def _tag_keys_sql(self) -> str:
        """A query of every distinct tag key in ``devices.birth`` (one column, ``key``)."""
        raise NotImplementedError

    def _lags_sql(self) -> str:
        """A query (one ``?``: since) of ``telemetry_ts`` minus the report's numeric ``ts`` (column ``lag``)."""
        raise NotImplementedError

    def _execute(self, sql: str, args: Sequence[Any] = (), at_once: bool = False) -> Any:
        raise NotImplementedError

    def _all(self, sql: str, args: Sequence[Any] = ()) -> list[Any]:
        raise NotImplementedError

    @staticmethod
    def _device(r: Any) -> DeviceRow:
        raise NotImplementedError

    # -- devices ----------------------------------------------------------------------------------

    def _field(self, key: str) -> tuple[str, list[Any]]:
        if key == "id":
            return "id", []
        if key == "status":
            return STATUS, []
        if key in FIELDS:
            return self._json(*FIELDS[key]), []
        sql, arg = self._json_tag(key)
        return sql, [arg]

    def _where(self, query: DeviceQuery) -> tuple[str, list[Any]]:
        """The SQL condition for ``query``: selector terms, version, text."""
        clauses, args = ["1=1"], []
        for key, want in query.terms:
            expr, expr_args = self._field(key)
            args += expr_args
            if want.endswith("*"):
                clauses.append(f"COALESCE(CAST({expr} AS TEXT), '') {self.like} ? ESCAPE '\\'")
                args.append(_like(want[:-1]) + "%")
            else:
                clauses.append(f"COALESCE(CAST({expr} AS TEXT), '') = ?")
                args.append(want)
        if query.version is not None:
            clauses.append(f"CAST({self._json('state', 'active.version')} AS TEXT) = ?")
            args.append(str(query.version))
        if query.text:
            fields = ("id", self._json("birth", "target"), self._json("state", "active.name"), self._json("birth", "tags"))
            clauses.append("(" + " OR ".join(f"COALESCE({f}, '') {self.like} ? ESCAPE '\\'" for f in fields) + ")")
            args += [f"%{_like(query.text)}%"] * len(fields)
        return " AND ".join(clauses), args

    def device_page(self, query: DeviceQuery) -> DevicePage:
        where, args = self._where(query)
        total = int(self._all(f"SELECT COUNT(*) AS n FROM devices WHERE {where}", args)[0]["n"])
        rows = self._all(f"SELECT * FROM devices WHERE {where} ORDER BY id LIMIT ? OFFSET ?", [*args, query.limit, query.offset])
        return DevicePage([self._device(r) for r in rows], total)

    def device_tag_keys(self) -> set[str]:
        return {str(r["key"]) for r in self._all(self._tag_keys_sql())}

    def device_counts(self) -> dict[tuple[str, str], int]:
        rows = self._all(f"SELECT COALESCE({self._json('birth', 'target')}, '') AS t, {STATUS} AS s, COUNT(*) AS n "
                         "FROM devices GROUP BY t, s")
        return {(str(r["t"]), str(r["s"])): int(r["n"]) for r in rows}

    def device_models(self) -> dict[tuple[str, int | None], int]:
        rows = self._all(f"SELECT COALESCE({self._json('state', 'active.name')}, '') AS m, "
                         f"CAST({self._json('state', 'active.version')} AS TEXT) AS v, COUNT(*) AS n FROM devices GROUP BY m, v")
        counts: dict[tuple[str, int | None], int] = {}
        for r in rows:
            version = None if r["v"] is None or r["m"] == "" or not str(r["v"]).isdigit() else int(r["v"])
            counts[(str(r["m"]), version)] = counts.get((str(r["m"]), version), 0) + int(r["n"])
        return counts

    def ingest_lags(self, since: float) -> list[float]:
        return [float(r["lag"]) for r in self._all(self._lags_sql(), (since,))]

    # -- users and tokens -------------------------------------------------------------------------

    def add_user(self, user: UserRow) -> bool:
        cursor = self._execute("INSERT INTO users(name, role, created) VALUES (?,?,?) ON CONFLICT(name) DO NOTHING",
                               (user.name, user.role.value, user.created))
        return bool(cursor.rowcount == 1)

    def users(self) -> list[UserRow]:
        return [_user(r) for r in self._all("SELECT * FROM users ORDER BY name")]

    def user(self, name: str) -> UserRow | None:
        rows = self._all("SELECT * FROM users WHERE name=?", (name,))
        return _user(rows[0]) if rows else None

    def remove_user(self, name: str, revoked: float) -> bool:
        with self.batch():
            self._execute('UPDATE tokens SET revoked=? WHERE "user"=? AND revoked IS NULL', (revoked, name))
            return bool(self._execute("DELETE FROM users WHERE name=?", (name,)).rowcount == 1)

    def add_token(self, token: TokenRow) -> None:
        self._execute('INSERT INTO tokens(id, "user", name, sha256, created, expires, revoked) VALUES (?,?,?,?,?,?,?)',
                      (token.id, token.user, token.name, token.sha256, token.created, token.expires, token.revoked))

    def tokens(self, user: str | None = None) -> list[TokenRow]:
        if user:
            return [_token(r) for r in self._all('SELECT * FROM tokens WHERE "user"=? ORDER BY created, id', (user,))]
        return [_token(r) for r in self._all("SELECT * FROM tokens ORDER BY created, id")]

    def token(self, token_id: str) -> TokenRow | None:
        rows = self._all("SELECT * FROM tokens WHERE id=?", (token_id,))
        return _token(rows[0]) if rows else None

    def revoke_token(self, token_id: str, revoked: float) -> bool:
        cursor = self._execute("UPDATE tokens SET revoked=? WHERE id=? AND revoked IS NULL", (revoked, token_id))
        return bool(cursor.rowcount == 1)

    # -- uploaded packages ------------------------------------------------------------------------

    def save_package(self, package: UploadedPackage) -> None:
        self._execute("INSERT INTO packages(variant, ref, uploaded, actor) VALUES (?,?,?,?) ON CONFLICT(variant) DO UPDATE "
                      "SET ref=excluded.ref, uploaded=excluded.uploaded, actor=excluded.actor",
                      (package.ref.variant, json.dumps(package.ref.to_dict()), package.uploaded, package.actor))

    def packages(self) -> list[UploadedPackage]:
        rows = self._all("SELECT * FROM packages ORDER BY uploaded, variant")
        return [UploadedPackage(PackageRef.from_dict(json.loads(r["ref"])), r["uploaded"], r["actor"] or "") for r in rows]

    def batch(self) -> Any:
        raise NotImplementedError


def _user(r: Any) -> UserRow:
    return UserRow(r["name"], Role(r["role"]), r["created"])


def _token(r: Any) -> TokenRow:
    return TokenRow(r["id"], r["user"], r["name"] or "", r["sha256"], r["created"], r["expires"], r["revoked"])

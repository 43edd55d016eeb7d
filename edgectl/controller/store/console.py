"""The console's queries (:class:`~edgectl.controller.store.protocol.ConsoleStore`), written once for both engines.

Device pages and counts are filtered, counted and paged in SQL: decoding 10,000 device rows in Python
to filter them costs about half a second. The only difference between the engines is how a JSON field
of a text column is read, which each back-end supplies: SQLite ``json_extract(birth, '$.target')``,
PostgreSQL ``birth::jsonb #>> '{target}'`` (and ILIKE, since SQLite's LIKE ignores ASCII case).
Models are read from ``device_models`` (``store/served.py``): a device serves several.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from edgectl.controller.accounts import Role, TokenRow, UserRow
from edgectl.controller.queries import DevicePage, DeviceQuery, UploadedPackage
from edgectl.controller.records import DeviceRecord, PackageRef

__all__ = ["ConsoleSql"]

STATUS = "CASE online WHEN 1 THEN 'online' WHEN 0 THEN 'offline' ELSE 'unknown' END"
FIELDS = {"target": ("birth", "target"), "agent": ("birth", "agent_version")}
SERVES = "EXISTS (SELECT 1 FROM device_models m WHERE m.device_id = devices.id"  # ... AND a condition on m, then ")"


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
    def _device(r: Any) -> DeviceRecord:
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

    def _match(self, expr: str, want: str) -> tuple[str, str]:
        """``expr`` equal to ``want``, or starting with it when it ends in ``*``: (SQL with one ``?``, its value)."""
        if want.endswith("*"):
            return f"COALESCE(CAST({expr} AS TEXT), '') {self.like} ? ESCAPE '\\'", _like(want[:-1]) + "%"
        return f"COALESCE(CAST({expr} AS TEXT), '') = ?", want

    def _serves(self, query: DeviceQuery) -> tuple[list[str], list[Any]]:
        """Conditions on the models a device serves: each ``model`` term, with ``version`` on the same model."""
        names = [want for key, want in query.terms if key == "model"]
        clauses, args = [], []
        for want in names or ([] if query.version is None else ["*"]):
            match, value = self._match("m.name", want)
            version = "" if query.version is None else " AND m.version = ?"
            clauses.append(f"{SERVES} AND {match}{version})")
            args += [value] + ([] if query.version is None else [query.version])
        return clauses, args

    def _where(self, query: DeviceQuery) -> tuple[str, list[Any]]:
        """The SQL condition for ``query``: selector terms, version, text."""
        clauses, args = self._serves(query)
        clauses.insert(0, "decommissioned IS NOT NULL" if query.decommissioned else "decommissioned IS NULL")
        for key, want in query.terms:
            if key == "model":
                continue
            if key == "version":  # some model the device serves is of that version
                match, value = self._match("m.version", want)
                clauses.append(f"{SERVES} AND {match})")
                args.append(value)
                continue
            expr, expr_args = self._field(key)
            match, value = self._match(expr, want)
            clauses.append(match)
            args += [*expr_args, value]
        if query.text:
            fields = ("id", self._json("birth", "target"), self._json("birth", "tags"))
            like = f"{self.like} ? ESCAPE '\\'"
            clauses.append("(" + " OR ".join(f"COALESCE({f}, '') {like}" for f in fields) + f" OR {SERVES} AND m.name {like}))")
            args += [f"%{_like(query.text)}%"] * (len(fields) + 1)
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
                         "FROM devices WHERE decommissioned IS NULL GROUP BY t, s")
        return {(str(r["t"]), str(r["s"])): int(r["n"]) for r in rows}

    def device_models(self) -> dict[tuple[str, int | None], int]:
        """Devices per model version they serve (a device serving two models counts under each); ("", None): none."""
        rows = self._all("SELECT name, version, COUNT(*) AS n FROM device_models m JOIN devices d ON d.id = m.device_id "
                         "WHERE d.decommissioned IS NULL GROUP BY name, version")
        counts = {(str(r["name"]), None if r["version"] is None else int(r["version"])): int(r["n"]) for r in rows}
        idle = self._all("SELECT COUNT(*) AS n FROM devices WHERE decommissioned IS NULL AND NOT EXISTS "
                         "(SELECT 1 FROM device_models m WHERE m.device_id = devices.id)")[0]["n"]
        if idle:
            counts[("", None)] = int(idle)
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

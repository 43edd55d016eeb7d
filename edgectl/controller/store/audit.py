"""The audit log's filtered, paged question (:class:`~edgectl.controller.queries.AuditQuery`), for both engines."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from edgectl.controller.queries import AuditPage, AuditQuery
from edgectl.controller.records import AuditEntry
from edgectl.controller.store.console import _like as like_escaped  # the console's LIKE escaping, one copy

__all__ = ["AuditSql"]


class AuditSql:
    """``audit_page``; a back-end supplies ``_all`` and ``like``."""

    like = "LIKE"

    def _all(self, sql: str, args: Sequence[Any] = ()) -> list[Any]:
        raise NotImplementedError

    def _audit_where(self, query: AuditQuery) -> tuple[str, list[Any]]:
        clauses: list[str] = ["1=1"]
        args: list[Any] = []
        for column, want in (("actor", query.actor), ("action", query.action)):
            if want.endswith("*"):
                clauses.append(f"{column} {self.like} ? ESCAPE '\\'")
                args.append(like_escaped(want[:-1]) + "%")
            elif want:
                clauses.append(f"{column}=?")
                args.append(want)
        for column, want in (("rollout_id", query.rollout_id), ("device_id", query.device_id)):
            if want:
                clauses.append(f"{column}=?")
                args.append(want)
        if query.since is not None:
            clauses, args = [*clauses, "ts>=?"], [*args, query.since]
        if query.until is not None:
            clauses, args = [*clauses, "ts<?"], [*args, query.until]
        return " AND ".join(clauses), args

    def audit_page(self, query: AuditQuery) -> AuditPage:
        """The entries matching ``query``: a page of the newest (oldest first within it) and the total."""
        where, args = self._audit_where(query)
        total = int(self._all(f"SELECT COUNT(*) AS n FROM audit WHERE {where}", args)[0]["n"])
        rows = self._all(f"SELECT * FROM audit WHERE {where} ORDER BY id DESC LIMIT ? OFFSET ?",
                         [*args, query.limit, query.offset])
        return AuditPage([AuditEntry(r["id"], r["ts"], r["actor"], r["rollout_id"] or "", r["device_id"] or "", r["action"],
                                     r["detail"] or "") for r in reversed(rows)], total)

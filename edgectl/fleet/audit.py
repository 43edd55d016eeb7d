"""The audit log for people and spreadsheets: time filters read from text, and a CSV export safe to open.

A CSV cell that starts with ``=``, ``+``, ``-``, ``@`` (or a tab or carriage return) is a formula to
spreadsheet programs: an actor name or a device-reported detail could run one on the operator's
machine. Such a cell is written with a leading ``'`` (OWASP's advice), and every cell is quoted as CSV
requires (RFC 4180: commas, quotes and line breaks inside a cell).
"""

from __future__ import annotations

import csv
import datetime as dt
import io
import math
from collections.abc import Iterable

from edgecore.errors import UserError
from edgectl.controller.records import AuditEntry

__all__ = ["CSV_COLUMNS", "audit_csv", "neutralised", "parse_time"]

CSV_COLUMNS = ("id", "time", "ts", "actor", "action", "rollout_id", "device_id", "detail")
FORMULA = ("=", "+", "-", "@", "\t", "\r")


def parse_time(text: str, field: str) -> float:
    """Unix seconds, or an ISO 8601 date or time (UTC unless it names its offset); UserError naming ``field``."""
    value = text.strip()
    try:
        seconds = float(value)
    except ValueError:
        try:
            when = dt.datetime.fromisoformat(value.replace("Z", "+00:00"))
        except ValueError:
            raise UserError(f"{field}: {text[:40]!r} is neither Unix seconds nor an ISO 8601 time "
                            "(2026-01-31 or 2026-01-31T12:00:00Z)") from None
        return (when if when.tzinfo else when.replace(tzinfo=dt.timezone.utc)).timestamp()
    if not math.isfinite(seconds) or seconds < 0:
        raise UserError(f"{field}: {text[:40]!r} is not a time")
    return seconds


def neutralised(cell: str) -> str:
    """The cell as text no spreadsheet runs as a formula."""
    return "'" + cell if cell.startswith(FORMULA) else cell


def audit_csv(entries: Iterable[AuditEntry]) -> str:
    out = io.StringIO()
    writer = csv.writer(out, quoting=csv.QUOTE_ALL, lineterminator="\r\n")
    writer.writerow(CSV_COLUMNS)
    for e in entries:
        when = dt.datetime.fromtimestamp(e.ts, dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
        writer.writerow([str(e.id), when, f"{e.ts:.3f}",
                         *(neutralised(v) for v in (e.actor, e.action, e.rollout_id, e.device_id, e.detail))])
    return out.getvalue()

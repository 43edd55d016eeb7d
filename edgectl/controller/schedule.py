"""Start times of scheduled rollouts: ISO 8601 with an offset in, seconds since the epoch kept, UTC shown."""

from __future__ import annotations

import time
from datetime import datetime

from edgecore.errors import UserError

__all__ = ["iso_utc", "parse_start_at"]


def parse_start_at(text: str, now: float, field: str = "start_at") -> float:
    """``text`` (e.g. ``2026-11-28T02:00:00+01:00``) as epoch seconds; UserError naming ``field`` when it does not
    parse, has no offset (a bare local time means something else on every host) or is not after ``now``."""
    try:
        when = datetime.fromisoformat(text.strip())
    except ValueError:
        raise UserError(f"{field}: {text[:60]!r} is not an ISO 8601 time (e.g. 2026-11-28T02:00:00+01:00)") from None
    if when.tzinfo is None or when.utcoffset() is None:
        raise UserError(f"{field}: {text[:60]!r} has no UTC offset: add one (Z, +01:00, ...)")
    at = when.timestamp()
    if at <= now:
        raise UserError(f"{field}: {text[:60]!r} is in the past (the controller's clock reads {iso_utc(now)})")
    return at


def iso_utc(ts: float) -> str:
    """``ts`` as ISO 8601 in UTC, to the second."""
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(ts))

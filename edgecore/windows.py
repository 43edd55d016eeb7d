"""Maintenance windows: when, in a device's local time, it may install an update.

A window is written ``DAYS HH:MM-HH:MM``: ``daily 02:00-04:00``, ``Mon-Fri 22:00-02:00`` (an end
before the start crosses midnight: the window belongs to the day it opens), ``Sat,Sun 00:00-24:00``.
A :class:`Windows` is several of them (open when any is). The controller predicts with this module
when each device may install (it knows the device's time zone from its birth); the agent, given the
same windows in its signed desired state, holds the installation until one opens by its own clock.
Both read the windows with the same code, so what the API takes the agent takes.

Times are minutes of the local day; a day is the calendar day in the time zone, so a window keeps
its local hours across daylight-saving changes (a window inside the hour a spring change skips is
not open that day).
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, time, timedelta, tzinfo
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

__all__ = ["DAYS", "MAX_WINDOWS", "Maintenance", "Window", "WindowError", "Windows", "device_timezone", "local_zone",
           "next_open_all", "zone"]

DAYS = ("Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun")
MAX_WINDOWS = 16
HORIZON_DAYS = 8  # every weekly window opens within a week and a day
_WINDOW = re.compile(r"^\s*(\S+)\s+(\d{2}):(\d{2})\s*-\s*(\d{2}):(\d{2})\s*$")


class WindowError(ValueError):
    """A window or time zone that does not parse; the message names what is wrong."""


@dataclass(frozen=True)
class Window:
    """Open on ``days`` (0 = Monday) from ``start`` to ``end`` minutes of the local day (end <= 1440; end < start:
    until ``end`` on the next day)."""

    days: frozenset[int]
    start: int
    end: int

    @classmethod
    def parse(cls, text: str) -> Window:
        match = _WINDOW.match(text) if isinstance(text, str) else None
        if match is None:
            raise WindowError(f"{str(text)[:60]!r} is not a window: write DAYS HH:MM-HH:MM (e.g. 'Mon-Fri 02:00-04:00')")
        days = _days(match.group(1))
        start, end = _minute(match.group(2), match.group(3), text), _minute(match.group(4), match.group(5), text)
        if start == 1440 or start == end:
            raise WindowError(f"{text!r}: the window opens at {match.group(2)}:{match.group(3)} and never stays open")
        return cls(days, start, end)

    def __str__(self) -> str:
        return f"{_days_text(self.days)} {_hhmm(self.start)}-{_hhmm(self.end)}"

    def is_open(self, local: datetime) -> bool:
        minute = local.hour * 60 + local.minute
        today, yesterday = local.weekday(), (local.weekday() - 1) % 7
        if self.end > self.start:
            return today in self.days and self.start <= minute < self.end
        return (today in self.days and minute >= self.start) or (yesterday in self.days and minute < self.end)

    def openings(self, ts: float, zone_: tzinfo, days: int = HORIZON_DAYS) -> list[float]:
        """When this window opens, as Unix times, on the local days from the day before ``ts`` for ``days`` days."""
        first = datetime.fromtimestamp(ts, zone_).date() - timedelta(days=1)
        found = []
        for offset in range(days + 1):
            day = first + timedelta(days=offset)
            if day.weekday() in self.days:
                local = datetime.combine(day, time(self.start // 60, self.start % 60), tzinfo=zone_)
                found.append(local.timestamp())
        return found


@dataclass(frozen=True)
class Windows:
    """A device's windows: open when any one is. Empty means no restriction (always open)."""

    windows: tuple[Window, ...] = ()

    @classmethod
    def parse(cls, texts: Sequence[str], what: str = "windows") -> Windows:
        if isinstance(texts, str) or not isinstance(texts, Sequence):
            raise WindowError(f"{what}: expected a list of windows such as ['Mon-Fri 02:00-04:00']")
        if len(texts) > MAX_WINDOWS:
            raise WindowError(f"{what}: {len(texts)} windows; at most {MAX_WINDOWS}")
        parsed = []
        for i, text in enumerate(texts):
            try:
                parsed.append(Window.parse(text))
            except WindowError as exc:
                raise WindowError(f"{what}[{i}]: {exc}") from None
        return cls(tuple(parsed))

    def texts(self) -> list[str]:
        return [str(w) for w in self.windows]

    def __bool__(self) -> bool:
        return bool(self.windows)

    def is_open(self, ts: float, zone_: tzinfo) -> bool:
        if not self.windows:
            return True
        local = datetime.fromtimestamp(ts, zone_)
        return any(w.is_open(local) for w in self.windows)

    def next_open(self, ts: float, zone_: tzinfo) -> float | None:
        """``ts`` if open then, else when one of the windows next opens; None if none opens within a week and a day."""
        return next_open_all([self], ts, zone_)


def next_open_all(schedules: Sequence[Windows], ts: float, zone_: tzinfo) -> float | None:
    """The first time from ``ts`` when every one of ``schedules`` is open (a device in several groups with windows
    installs only when all of them allow it); None when they do not overlap within a week and a day.

    The intersection of unions of intervals opens either at ``ts`` or where one of its windows opens, so those are the
    only candidates."""
    candidates = [ts, *sorted(t for s in schedules for w in s.windows for t in w.openings(ts, zone_) if t > ts)]
    for candidate in candidates:
        if candidate - ts > HORIZON_DAYS * 86400:
            break
        if all(s.is_open(candidate, zone_) for s in schedules):
            return candidate
    return None


@dataclass(frozen=True)
class Maintenance:
    """When a device may install one update: inside every one of ``schedules`` at once (one per group with windows),
    or at any time from ``force_at`` on (the rollout's forced-update deadline, a Unix time)."""

    schedules: tuple[Windows, ...] = ()
    force_at: float | None = None

    def __bool__(self) -> bool:
        return bool(self.schedules) or self.force_at is not None

    def allowed_from(self, ts: float, zone_: tzinfo) -> float | None:
        """``ts`` when it may install then, else the first time it may; None: its windows never open together and no
        deadline forces it."""
        if self.force_at is not None and ts >= self.force_at:
            return ts
        opens = next_open_all([s for s in self.schedules if s], ts, zone_)
        if self.force_at is None:
            return opens
        return self.force_at if opens is None else min(opens, self.force_at)

    def to_json(self) -> dict[str, Any]:
        return {"windows": [s.texts() for s in self.schedules], "force_at": self.force_at}

    @classmethod
    def from_json(cls, data: Any, what: str = "maintenance") -> Maintenance:
        """Read what the controller sent; WindowError naming ``what.key`` for anything malformed."""
        if not isinstance(data, dict) or set(data) - {"windows", "force_at"}:
            raise WindowError(f"{what}: expected {{\"windows\": [[window, ...], ...], \"force_at\": time or null}}")
        lists = data.get("windows") or []
        if not isinstance(lists, list) or len(lists) > MAX_WINDOWS:
            raise WindowError(f"{what}.windows: expected at most {MAX_WINDOWS} lists of windows")
        force_at = data.get("force_at")
        if force_at is not None and (isinstance(force_at, bool) or not isinstance(force_at, (int, float))
                                     or not 0 <= force_at < 1e11):
            raise WindowError(f"{what}.force_at: expected a Unix time or null")
        schedules = tuple(Windows.parse(texts, f"{what}.windows[{i}]") for i, texts in enumerate(lists))
        return cls(schedules, None if force_at is None else float(force_at))


def zone(name: str) -> tzinfo:
    """The IANA time zone ``name`` (``Europe/Berlin``, ``UTC``); WindowError when it is not one known here. zoneinfo
    itself refuses paths (absolute, or climbing out of the zone database)."""
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError, TypeError, OSError):
        raise WindowError(f"time zone {str(name)[:60]!r} is not an IANA name known here, such as Europe/Berlin "
                          "(a name missing from this machine's zone database: install tzdata)") from None


def device_timezone(configured: str | None = None, etc: Path = Path("/etc")) -> str | None:
    """This machine's IANA time zone name: ``configured`` (agent.yaml ``timezone``), else ``$TZ``, else
    ``/etc/timezone``, else where ``/etc/localtime`` links to; None when none of them names one."""
    for name in (configured, os.environ.get("TZ", "").lstrip(":") or None, _read(etc / "timezone"), _linked(etc / "localtime")):
        if name:
            try:
                zone(name)
                return name
            except WindowError:
                continue
    return None


def local_zone(name: str | None) -> tzinfo:
    """The zone a device reads its windows in: ``name`` (from :func:`device_timezone`), else this machine's current UTC
    offset (without its daylight-saving rule, which only a zone name carries)."""
    if name:
        return zone(name)
    found = datetime.now().astimezone().tzinfo
    return found if found is not None else ZoneInfo("UTC")


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip() or None
    except OSError:
        return None


def _linked(path: Path) -> str | None:
    try:
        target = str(path.resolve()) if path.is_symlink() else ""
    except OSError:
        return None
    marker = "/zoneinfo/"
    return target.split(marker, 1)[1] if marker in target else None


def _days(text: str) -> frozenset[int]:
    if text.lower() == "daily":
        return frozenset(range(7))
    days: set[int] = set()
    for part in text.split(","):
        first, _, last = part.partition("-")
        a, b = _day(first, text), _day(last, text) if last else _day(first, text)
        days.update((a + i) % 7 for i in range((b - a) % 7 + 1))
    return frozenset(days)


def _day(name: str, text: str) -> int:
    for i, day in enumerate(DAYS):
        if name.capitalize() == day:
            return i
    raise WindowError(f"{text!r}: {name!r} is not a day (Mon, Tue, Wed, Thu, Fri, Sat, Sun, or 'daily')")


def _minute(hours: str, minutes: str, text: str) -> int:
    h, m = int(hours), int(minutes)
    if m > 59 or h > 24 or (h == 24 and m):
        raise WindowError(f"{text!r}: {hours}:{minutes} is not a time of day (00:00 to 24:00)")
    return h * 60 + m


def _hhmm(minute: int) -> str:
    return f"{minute // 60:02d}:{minute % 60:02d}"


def _days_text(days: frozenset[int]) -> str:
    """``daily``, or runs of days as ``Mon-Fri,Sun``."""
    if len(days) == 7:
        return "daily"
    runs: list[list[int]] = []
    for day in sorted(days):
        if runs and runs[-1][-1] == day - 1:
            runs[-1].append(day)
        else:
            runs.append([day])
    return ",".join(DAYS[r[0]] if len(r) == 1 else f"{DAYS[r[0]]}-{DAYS[r[-1]]}" for r in runs)

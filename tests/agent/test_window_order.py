"""The units of a desired set go in the order their windows open (agent/deploy/window.py, WindowGate.in_order).

The manifests are never read here: the order depends on the entries' windows only. The whole flow on
a real agent (one model held for its window, another installed at once) is in
tests/deploy/test_windows_agent.py.
"""

from __future__ import annotations

from datetime import datetime, timezone

from agent.deploy.plan import Wanted
from agent.deploy.record import Options
from agent.deploy.window import WindowGate
from edgecore.windows import Maintenance, Windows

NOW = datetime(2026, 12, 2, 12, 0, tzinfo=timezone.utc).timestamp()  # a Wednesday, 12:00 UTC


def _unit(name: str, *windows: str, force_at: float | None = None) -> tuple[Wanted, ...]:
    maintenance = Maintenance(tuple(Windows.parse([w]) for w in windows), force_at) if windows or force_at else None
    return (Wanted(name, b"", Options(maintenance=maintenance)),)


def test_units_that_may_install_now_go_first_then_by_opening_and_never_last() -> None:
    gate = WindowGate(timezone.utc, clock=lambda: NOW)
    never = _unit("never", "Mon 01:00-02:00", "Tue 01:00-02:00")
    late, soon = _unit("late", "daily 20:00-21:00"), _unit("soon", "daily 14:00-15:00")
    free, open_now = _unit("free"), _unit("open", "daily 11:00-13:00")
    forced = _unit("forced", "daily 20:00-21:00", force_at=NOW - 1)
    order = gate.in_order([never, late, free, soon, forced, open_now])
    assert [unit[0].deployment_id for unit in order] == ["free", "forced", "open", "soon", "late", "never"]

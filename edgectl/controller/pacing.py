"""Rollout pacing: a wave sends its desired states at most ``max_per_minute`` a minute, evenly spaced.

Two limits together: the rows sent in the last 60 s (``data.sent_at``, kept in the store, so a
restarted or new engine leader keeps the rate) and an even spacing of 60/N s between sends (kept
in memory: after a restart at most one more send comes early, still within the 60 s budget).
"""

from __future__ import annotations

from edgectl.controller.records import DeviceStatus, RolloutDevice, RolloutRow

__all__ = ["SENT_AT", "WINDOW_S", "Pacer"]

SENT_AT = "sent_at"  # key in a row's data: when the engine sent its desired state (paced rollouts)
WINDOW_S = 60.0


class Pacer:
    """Which planned rows of a wave may be sent now."""

    def __init__(self) -> None:
        self._next: dict[str, float] = {}  # rollout id -> when the next send is due

    def due(self, rollout: RolloutRow, rows: list[RolloutDevice], now: float) -> list[RolloutDevice]:
        planned = [r for r in rows if r.status == DeviceStatus.PLANNED]
        rate = rollout.spec.max_per_minute
        if rate <= 0 or not planned:
            return planned
        recent = sum(now - float(r.data.get(SENT_AT, -WINDOW_S)) < WINDOW_S for r in rows)
        interval = WINDOW_S / rate
        start = max(self._next.get(rollout.id, now), now - max(interval, 1.0))  # no credit saved up while idle
        if now < start or recent >= rate:
            return []
        count = min(rate - recent, len(planned), 1 + int((now - start) / interval))
        self._next[rollout.id] = start + count * interval
        return planned[:count]

    def stretch_s(self, rollout: RolloutRow, rows: list[RolloutDevice]) -> float:
        """How much longer a paced wave takes to send than an unpaced one (added to the wave timeout)."""
        rate = rollout.spec.max_per_minute
        return len(rows) * WINDOW_S / rate if rate > 0 else 0.0

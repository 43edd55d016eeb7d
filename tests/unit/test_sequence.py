"""Sequence numbers for signed controller messages: monotonic, and never at or below a raised floor."""

from __future__ import annotations

import time
from pathlib import Path

from edgectl.sequence import next_sequence, raise_sequence_floor


def test_numbers_rise_even_within_one_millisecond(tmp_path: Path) -> None:
    path = tmp_path / "sequence"
    numbers = [next_sequence(path) for _ in range(50)]
    assert numbers == sorted(set(numbers))


def test_a_raised_floor_wins_over_a_clock_behind_it(tmp_path: Path) -> None:
    path = tmp_path / "sequence"
    ahead = int((time.time() + 3600) * 1000)  # what another host's counter reached
    raise_sequence_floor(ahead, path)
    assert next_sequence(path) == ahead + 1


def test_a_lower_floor_never_lowers_the_counter(tmp_path: Path) -> None:
    path = tmp_path / "sequence"
    last = next_sequence(path)
    raise_sequence_floor(5, path)
    assert next_sequence(path) > last

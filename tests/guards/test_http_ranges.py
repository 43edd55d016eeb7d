"""A 206's Content-Range at its length edge: numbers of 20 digits are read (leading zeros are still numbers), 21 are
refused before any int() of them, whatever they say. ./scripts/mutants runs this for edgecore/delivery/http_fetch.py."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from tests.guards.test_http_sources import DATA, Origin, fetch, origin

__all__ = ["origin"]  # the fixture, shared with test_http_sources


def _padded(width: int) -> str:
    return str(len(DATA)).zfill(width)


def test_a_content_range_of_20_digits_is_read(origin: Origin, tmp_path: Path) -> None:
    done, download = fetch(origin, tmp_path, lambda lo, hi: (206, {"Content-Range": f"bytes {lo}-{hi}/{_padded(20)}"},
                                                             DATA[lo:hi + 1]))
    assert done and download.complete


def test_a_content_range_of_21_digits_is_refused(origin: Origin, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="edgecore.delivery.http_fetch"):
        done, download = fetch(origin, tmp_path, lambda lo, hi: (206, {"Content-Range": f"bytes {lo}-{hi}/{_padded(21)}"},
                                                                 DATA[lo:hi + 1]))
    assert not done and not download.complete and download.have == set()
    assert "206 with a Content-Range past any payload's size" in caplog.text

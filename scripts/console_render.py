"""Console benchmark, part 2 (used by scripts/bench_console.py): pages' first full render in headless Chromium.

Each load is a fresh navigation to the console (its HTML, CSS and ES modules fetched again), signed
in through sessionStorage; the time is from navigation start to the first paint after the page
drew its data (``window.edgectlRendered``, set by the console's app.js). Live updates are off
(poll interval of a minute) so that only the first render is measured.
"""

from __future__ import annotations

import statistics
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from tests.console.browser import Browser, missing  # noqa: E402

__all__ = ["PAGES", "missing", "render_lines", "render_times"]

PAGES = {"fleet": "/", "devices": "/devices"}  # the fleet overview, and the devices table's first page of 50


def render_times(url: str, token: str, loads: int = 5) -> dict[str, list[float]]:
    """Milliseconds to the first full render of each of :data:`PAGES`, ``loads`` times each (after one warm-up)."""
    browser = Browser(f"{url}/console/", poll_ms=60_000)
    times: dict[str, list[float]] = {page: [] for page in PAGES}
    try:
        browser.open("/signin", ready="signin")
        browser.js("sessionStorage.setItem('edgectl.token', arguments[0]);", token)
        for page, route in PAGES.items():
            for i in range(loads + 1):
                browser.open(route, ready=page)
                rendered: Any = browser.wait(lambda: browser.js("return window.edgectlRendered || null;"), 30, f"{page} painted")
                if i:  # the first load warms the server's caches and the browser's process
                    times[page].append(float(rendered["ms"]))
    finally:
        browser.close()
    return times


def render_lines(times: dict[str, list[float]], devices: int) -> list[str]:
    what = {"fleet": "fleet page (counts by status, target, model version; recent rollouts)",
            "devices": "devices page (first page of 50 rows)"}
    return [f"- {what[page]}: first full render in Chromium with {devices} devices: median {statistics.median(ms):.0f} ms, "
            f"max {max(ms):.0f} ms over {len(ms)} fresh loads (navigation start to the first paint with the data)"
            for page, ms in times.items()]

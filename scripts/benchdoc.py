"""What benchmark reports share: a line describing the machine, and their own section of docs/benchmarks.md."""

from __future__ import annotations

import os
import platform
import subprocess
import time
from pathlib import Path

__all__ = ["machine", "replace_section", "write_section"]

DOC = Path(__file__).resolve().parents[1] / "docs" / "benchmarks.md"


def machine() -> str:
    """CPU model, cores, Python and Mosquitto versions: the context every figure needs."""
    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), platform.processor() or "unknown CPU")
    try:
        mosq = subprocess.run(["mosquitto", "-h"], capture_output=True, text=True).stdout.splitlines()[0].strip()
    except (OSError, IndexError):
        mosq = "mosquitto"
    return f"{cpu}, nproc {os.cpu_count()}, Python {platform.python_version()}, {mosq}"


def write_section(name: str, command: str, body: str) -> Path:
    """Write ``body`` as the ``## NAME`` section of docs/benchmarks.md under the standard preamble."""
    return replace_section(name, f"## {name}\n\nMeasured by `{command}` on {time.strftime('%Y-%m-%d')}; all figures"
                                 f" come from one run. The machine is shared with other jobs, so absolute times are noisy;"
                                 f" the ratios within one run are the figures to read.\n\n{body}\n")


def replace_section(name: str, section: str) -> Path:
    """Replace (or append) the ``## NAME`` section of docs/benchmarks.md with ``section``, leaving the others alone."""
    text = DOC.read_text() if DOC.exists() else "# Benchmarks\n"
    lines = text.splitlines(keepends=True)
    start = next((i for i, line in enumerate(lines) if line.rstrip() == f"## {name}"), None)
    section = section.rstrip("\n") + "\n"
    if start is None:
        text = text.rstrip("\n") + "\n\n" + section
    else:
        end = next((i for i in range(start + 1, len(lines)) if lines[i].startswith("## ")), len(lines))
        text = "".join(lines[:start]) + section + ("\n" + "".join(lines[end:]) if end < len(lines) else "")
    DOC.write_text(text)
    return DOC

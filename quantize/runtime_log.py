"""onnxruntime's warnings (C++ logger and Python logging alike) to a log file, summarized in one line.

onnxruntime's C++ logger writes straight to file descriptor 2, so a quantization run of a large
model floods the terminal with thousands of lines. While the capture is active, fd 2 points at a
temp file; Python's `sys.stderr` is pointed at the terminal's original descriptor, so the CLI's own
messages (progress, notes, the one-line error) still reach the user.
"""

from __future__ import annotations

import os
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import onnxruntime as ort

__all__ = ["RuntimeLog", "capture_runtime_log"]

_WARNING = 2  # onnxruntime severity: 0 verbose, 1 info, 2 warning, 3 error, 4 fatal


@dataclass
class RuntimeLog:
    """What the runtime wrote while the capture was active."""

    text: str = ""

    def lines(self) -> list[str]:
        """Non-empty lines."""
        return [line for line in self.text.splitlines() if line.strip()]

    def summary(self, path: Path) -> str:
        """One line: how many lines, how many warnings and errors, where the log is."""
        lines = self.lines()
        warnings = sum(1 for line in lines if " W:" in line or "WARNING" in line or "[W:" in line)
        errors = sum(1 for line in lines if " E:" in line or "ERROR" in line or "[E:" in line)
        return (f"runtime log: {len(lines)} lines from onnxruntime ({warnings} warnings, {errors} errors) "
                f"in {path}")

    def write(self, path: Path) -> None:
        """Save the log (plain write: a log, not a result)."""
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(self.text)


@contextmanager
def capture_runtime_log(log: RuntimeLog | None = None) -> Iterator[RuntimeLog]:
    """Redirect fd 2 to a temp file for the block; `log`'s text is filled in when the block ends."""
    log = log if log is not None else RuntimeLog()
    ort.set_default_logger_severity(_WARNING)
    sys.stderr.flush()
    saved = os.dup(2)
    terminal = os.fdopen(os.dup(saved), "w", buffering=1, encoding="utf-8", errors="replace")
    original_stderr = sys.stderr
    with tempfile.TemporaryFile(prefix="edgectl-ort-log-") as sink:
        os.dup2(sink.fileno(), 2)
        sys.stderr = terminal
        try:
            yield log
        finally:
            sys.stderr = original_stderr
            terminal.close()
            os.dup2(saved, 2)
            os.close(saved)
            sink.seek(0)
            log.text = sink.read().decode("utf-8", "replace")

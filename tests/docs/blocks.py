"""The fenced blocks of a Markdown page, and the shell script that runs a page's command blocks in order.

A command block (```bash, ```sh, ```shell, ```console) either runs, or is marked illustrative by an HTML
comment on the line before it (blank lines between are allowed), with the reason why it cannot run here::

    <!-- illustrative: needs a Jetson -->

A ```console block runs its ``$ `` lines (with their ``\\`` continuations); the other lines are output.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

__all__ = ["COMMAND_LANGUAGES", "Block", "MarkerError", "ScriptLine", "blocks", "marker_errors", "page_script"]

COMMAND_LANGUAGES = frozenset({"bash", "sh", "shell", "console"})
_FENCE = re.compile(r"^(?P<indent>\s*)(?P<fence>`{3,}|~{3,})(?P<info>.*)$")
_MARKER = re.compile(r"^\s*<!--\s*illustrative:(?P<reason>.*?)-->\s*$")
_MARKER_LIKE = re.compile(r"<!--\s*illustrative", re.IGNORECASE)


@dataclass(frozen=True)
class Block:
    """One fenced block: ``line`` is the 1-based line of its opening fence."""

    path: Path
    line: int
    language: str
    body: list[str]
    illustrative: str | None  # the marker's reason, "" for a marker without one; None: no marker

    @property
    def where(self) -> str:
        return f"{self.path.name}:{self.line}"

    @property
    def runs(self) -> bool:
        return self.language in COMMAND_LANGUAGES and self.illustrative is None

    def commands(self) -> list[tuple[int, str]]:
        """(doc line, shell line) for each line the block runs."""
        first = self.line + 1
        if self.language != "console":
            return [(first + i, text) for i, text in enumerate(self.body)]
        out: list[tuple[int, str]] = []
        continued = False
        for i, text in enumerate(self.body):
            if continued or text.startswith("$ "):
                out.append((first + i, text[2:] if not continued else text))
                continued = text.rstrip().endswith("\\")
        return out


@dataclass(frozen=True)
class MarkerError:
    path: Path
    line: int
    problem: str

    def __str__(self) -> str:
        return f"{self.path.name}:{self.line}: {self.problem}"


def _marker_before(lines: list[str], index: int) -> str | None:
    """The reason of the illustrative marker on the last non-blank line before ``index``, if it is one."""
    j = index - 1
    while j >= 0 and not lines[j].strip():
        j -= 1
    if j < 0:
        return None
    found = _MARKER.match(lines[j])
    return found.group("reason").strip() if found else None


def blocks(path: Path) -> list[Block]:
    """Every fenced block of the page, in order."""
    lines = path.read_text(encoding="utf-8").splitlines()
    found: list[Block] = []
    i = 0
    while i < len(lines):
        opening = _FENCE.match(lines[i])
        if opening is None or ("`" in opening.group("info") and opening.group("fence")[0] == "`"):
            i += 1
            continue
        fence, indent = opening.group("fence"), len(opening.group("indent"))
        language = opening.group("info").strip().split(" ")[0].lower() if opening.group("info").strip() else ""
        body: list[str] = []
        j = i + 1
        while j < len(lines):
            closing = _FENCE.match(lines[j])
            if closing and closing.group("fence")[0] == fence[0] and len(closing.group("fence")) >= len(fence) \
                    and not closing.group("info").strip():
                break
            # Markdown strips up to the fence's own indentation from each line of the block.
            body.append(lines[j][min(indent, len(lines[j]) - len(lines[j].lstrip())):])
            j += 1
        found.append(Block(path, i + 1, language, body, _marker_before(lines, i)))
        i = j + 1
    return found


def marker_errors(path: Path) -> list[MarkerError]:
    """Markers that say nothing, are malformed, or mark no command block (a stray one after an edit moved a block)."""
    lines = path.read_text(encoding="utf-8").splitlines()
    starts = {block.line - 1: block for block in blocks(path)}
    inside = {n for block in blocks(path) for n in range(block.line - 1, block.line + len(block.body) + 1)}
    errors: list[MarkerError] = []
    for n, text in enumerate(lines):
        if not _MARKER_LIKE.search(text) or n in inside:
            continue
        marker = _MARKER.match(text)
        if marker is None:
            errors.append(MarkerError(path, n + 1, "malformed marker: write <!-- illustrative: REASON --> alone on its line"))
            continue
        if not marker.group("reason").strip():
            errors.append(MarkerError(path, n + 1, "illustrative marker without a reason"))
        after = n + 1
        while after < len(lines) and not lines[after].strip():
            after += 1
        block = starts.get(after)
        if block is None:
            errors.append(MarkerError(path, n + 1, "illustrative marker not followed by a fenced block"))
        elif block.language not in COMMAND_LANGUAGES:
            errors.append(MarkerError(path, n + 1, f"illustrative marker on a ```{block.language} block, which never runs"))
    return errors


@dataclass(frozen=True)
class ScriptLine:
    """Which doc line a line of the generated script came from (None: the runner's own)."""

    block: Block | None
    doc_line: int | None


def page_script(path: Path) -> tuple[str, list[ScriptLine]]:
    """A bash script that runs the page's runnable blocks in order, and where each of its lines came from.

    On the first command that fails, an ERR trap prints ``::docs-failed LINENO STATUS`` to stderr and the
    script stops (``set -euo pipefail``)."""
    text: list[str] = []
    origin: list[ScriptLine] = []

    def emit(line: str, block: Block | None = None, doc_line: int | None = None) -> None:
        text.append(line)
        origin.append(ScriptLine(block, doc_line))

    emit("set -euo pipefail")
    emit("trap 'status=$?; echo \"::docs-failed $LINENO $status\" >&2' ERR")
    for block in blocks(path):
        if not block.runs:
            continue
        emit(f"echo '::docs-block {block.where}' >&2")
        for doc_line, command in block.commands():
            emit(command, block, doc_line)
    emit("echo '::docs-done' >&2")
    return "\n".join(text) + "\n", origin

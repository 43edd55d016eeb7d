"""Docs that run: every command block of README.md and docs/*.md runs here, or says why it cannot.

Each page's runnable blocks run in order in one bash (so a block can use what an earlier one made), in a
fresh working directory with a fresh EDGECTL_HOME and HOME, this checkout's venv first on PATH, and the
files the pages take as the reader's own: ``model.onnx`` (an image classifier whose input ``input`` has
dynamic batch, height and width), ``det.onnx`` (the same with a static 1x3x32x32 ``image``), ``calib/``
and ``held_out/`` (.npy samples), ``images/`` (PNGs) with ``prep.yaml``, and ``samples/`` (.npy).
A block that needs hardware, a network, a long-running daemon or a whole fleet is marked
``<!-- illustrative: REASON -->`` instead (tests/docs/blocks.py).
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
from pathlib import Path

import numpy as np
import onnx
import pytest
from PIL import Image

from edgectl.examples import tiny_classifier
from tests.checkout import REPO, checkout_env
from tests.docs.blocks import COMMAND_LANGUAGES, blocks, marker_errors, page_script

PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
RUNNING = [page for page in PAGES if any(block.runs for block in blocks(page))]
TIMEOUT_S = 120


def reader_files(work: Path) -> None:
    """What the pages' commands take as the reader's own files."""
    model = onnx.load(tiny_classifier(work / "model.onnx", seed=7))
    for node in model.graph.node:
        node.input[:] = ["input" if name == "image" else name for name in node.input]
    model.graph.input[0].name = "input"
    dims = model.graph.input[0].type.tensor_type.shape.dim
    for index, name in ((0, "N"), (2, "H"), (3, "W")):
        dims[index].dim_param = name
    onnx.save(model, work / "model.onnx")
    tiny_classifier(work / "det.onnx", seed=8)
    rng = np.random.default_rng(0)
    for name in ("calib", "held_out", "samples"):
        (work / name).mkdir()
        for i in range(4):
            np.save(work / name / f"{i:02d}.npy", rng.standard_normal((1, 3, 32, 32)).astype(np.float32))
    (work / "images").mkdir()
    for i in range(4):
        Image.fromarray(rng.integers(0, 256, (40, 48, 3), dtype=np.uint8)).save(work / "images" / f"{i:02d}.png")
    (work / "prep.yaml").write_text("inputs:\n  input:\n    resize: [32, 32]\n    channel_order: RGB\n"
                                    "    mean: [127, 127, 127]\n    std: [128, 128, 128]\n")


def run_page(page: Path, tmp: Path, timeout_s: float = TIMEOUT_S) -> str | None:
    """Run the page's runnable blocks; None when all passed, else what failed, as FILE:LINE, the line and its output."""
    script, origin = page_script(page)
    work, home = tmp / "work", tmp / "home"
    work.mkdir(parents=True)
    home.mkdir(parents=True)
    reader_files(work)
    base = {name: value for name, value in os.environ.items() if not name.startswith(("EDGECTL_", "EDGE_AGENT_"))}
    env = checkout_env(base, EDGECTL_HOME=str(home / ".edgectl"), HOME=str(home), COLUMNS="120",
                       PATH=os.pathsep.join([str(REPO / ".venv" / "bin"), base.get("PATH", "")]))
    # Its own session, so that a command that never ends is killed with everything it started.
    with subprocess.Popen(["bash", "-c", script, page.name], cwd=work, env=env, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True, start_new_session=True) as done:
        try:
            stdout, stderr = done.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(done.pid, signal.SIGKILL)
            stdout, stderr = done.communicate()
            started = re.findall(r"::docs-block (\S+)", stderr)
            return f"{started[-1] if started else page.name}: still running after {timeout_s:.0f} s\n{stderr[-2000:]}"
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(done.pid, signal.SIGKILL)  # whatever a block left behind in the background
    failed = re.search(r"::docs-failed (\d+) (\d+)", stderr)
    if done.returncode == 0 and failed is None and "::docs-done" in stderr:
        return None
    output = (stdout[-1500:] + stderr[-2500:]).strip()
    if failed is None:
        return f"{page.name}: the page's script exited {done.returncode}\n{output}"
    line, status = int(failed.group(1)), failed.group(2)
    where = origin[line - 1] if 0 < line <= len(origin) else None
    if where is None or where.block is None or where.doc_line is None:
        return f"{page.name}: a command failed (exit {status}) at script line {line}\n{output}"
    lines = page.read_text(encoding="utf-8").splitlines()
    return f"{page.name}:{where.doc_line}: exit {status}: {lines[where.doc_line - 1].strip()}\n{output}"


@pytest.mark.parametrize("page", RUNNING, ids=[page.name for page in RUNNING])
def test_the_command_blocks_of_the_page_run(page: Path, tmp_path: Path) -> None:
    problem = run_page(page, tmp_path)
    assert problem is None, "a command in the docs failed; fix the doc (or mark it <!-- illustrative: why -->):\n" + problem


def test_illustrative_markers_say_why_and_mark_a_command_block() -> None:
    errors = [str(error) for page in PAGES for error in marker_errors(page)]
    assert not errors, "\n".join(errors)


def test_every_fenced_block_names_its_language() -> None:
    # A command block without a language would be neither run nor marked: `text` for trees and synopses.
    untagged = [block.where for page in PAGES for block in blocks(page) if not block.language]
    assert not untagged, f"fenced blocks without a language (```bash to run, ```text for the rest): {untagged}"


def test_the_runner_finds_the_pages_command_blocks() -> None:
    found = [block for page in PAGES for block in blocks(page) if block.language in COMMAND_LANGUAGES]
    assert len(found) >= 25 and any(block.runs for block in found)
    readme = blocks(REPO / "README.md")
    assert any(block.runs and any("edgectl keys init" in line for line in block.body) for block in readme)


# The runner's own guards, on pages written here.

def _page(tmp_path: Path, text: str) -> Path:
    page = tmp_path / "page.md"
    page.write_text(text)
    return page


def test_a_failing_unmarked_block_fails_naming_its_file_and_line(tmp_path: Path) -> None:
    page = _page(tmp_path, "# t\n\n```bash\ntrue\n```\n\ntext\n\n```sh\necho made > made.txt\ntest -s made.txt\n"
                           "edgectl no-such-command\n```\n")
    problem = run_page(page, tmp_path / "run")
    assert problem is not None and problem.startswith("page.md:12: exit 2: edgectl no-such-command"), problem


def test_a_marked_block_does_not_run_and_later_blocks_see_earlier_ones(tmp_path: Path) -> None:
    page = _page(tmp_path, "```bash\nX=1; echo a > a.txt\n```\n<!-- illustrative: needs a Jetson -->\n\n"
                           "```bash\nexit 7\n```\n```console\n$ test -s a.txt && \\\n  test \"$X\" = 1\n"
                           "some output\n$ edgectl --help >/dev/null\n```\n")
    assert [block.runs for block in blocks(page)] == [True, False, True]
    assert blocks(page)[1].illustrative == "needs a Jetson"
    assert run_page(page, tmp_path / "run") is None


def test_a_block_that_never_ends_is_reported(tmp_path: Path) -> None:
    page = _page(tmp_path, "```bash\necho start\n```\n\n```bash\nsleep 30\n```\n")
    problem = run_page(page, tmp_path / "run", timeout_s=3)
    assert problem is not None and problem.startswith("page.md:5: still running after 3 s"), problem


def test_markers_without_a_reason_or_a_block_are_refused(tmp_path: Path) -> None:
    page = _page(tmp_path, "<!-- illustrative: -->\n```bash\ntrue\n```\n\n<!-- illustrative -->\n```bash\ntrue\n```\n\n"
                           "<!-- illustrative: stray -->\n\nprose\n\n<!-- illustrative: json never runs -->\n```json\n{}\n```\n")
    assert [str(error) for error in marker_errors(page)] == [
        "page.md:1: illustrative marker without a reason",
        "page.md:6: malformed marker: write <!-- illustrative: REASON --> alone on its line",
        "page.md:11: illustrative marker not followed by a fenced block",
        "page.md:15: illustrative marker on a ```json block, which never runs",
    ]


def test_fences_are_read_as_markdown_reads_them(tmp_path: Path) -> None:
    page = _page(tmp_path, "````markdown\n```bash\nnot a block of its own\n```\n````\n\n"
                           "- item\n\n  ```bash\n  echo indented\n    --kept\n  ```\n\n```\nuntagged\n  indented\n```\n")
    found = blocks(page)
    assert [(block.line, block.language, block.body) for block in found] == [
        (1, "markdown", ["```bash", "not a block of its own", "```"]),
        (9, "bash", ["echo indented", "  --kept"]),
        (14, "", ["untagged", "  indented"]),
    ]

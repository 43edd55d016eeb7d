"""A venv holding only what ``pip install 'edgectl[agent]'`` installs, made from this venv's distributions.

The requirements are read from pyproject.toml (the base dependencies and the ``agent`` extra) and
followed through each installed distribution's own metadata (``Requires-Dist`` with its markers),
so the venv has exactly the declared closure: a module the agent imports without declaring it,
onnx or OpenVINO among them, is missing there as it would be on a device. The distributions are
linked, not downloaded, so the venv takes a second to build.
"""

from __future__ import annotations

import importlib.metadata as metadata
import subprocess
import sys
from pathlib import Path

import tomllib
from packaging.markers import default_environment
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from tests.checkout import REPO

__all__ = ["declared", "lean_venv", "requirement_closure"]


def declared(extra: str = "agent") -> list[Requirement]:
    """The project's base dependencies plus one extra's, from pyproject.toml."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    return [Requirement(r) for r in [*project["dependencies"], *project["optional-dependencies"][extra]]]


def requirement_closure(requirements: list[Requirement]) -> dict[str, metadata.Distribution]:
    """Every installed distribution the requirements pull in (markers evaluated for this interpreter)."""
    found: dict[str, metadata.Distribution] = {}
    todo = [(r, "") for r in requirements]
    while todo:
        req, extra = todo.pop()
        environment = {key: str(value) for key, value in default_environment().items()} | {"extra": extra}
        if req.marker is not None and not req.marker.evaluate(environment):
            continue
        name = canonicalize_name(req.name)
        dist = metadata.distribution(name)
        for wanted in req.extras or {""}:
            key = f"{name}[{wanted}]"
            if key in found:
                continue
            found[key] = dist
            todo += [(Requirement(r), wanted) for r in dist.requires or []]
    return {key.split("[")[0]: dist for key, dist in found.items()}


def lean_venv(dest: Path, extra: str = "agent") -> Path:
    """A venv at ``dest`` with the closure of ``extra`` linked in; returns its python."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(dest)], check=True)
    python = dest / "bin" / "python"
    site = Path(subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               check=True, capture_output=True, text=True).stdout.strip())
    for dist in requirement_closure(declared(extra)).values():
        _link(dist, site)
    return python


def _link(dist: metadata.Distribution, site: Path) -> None:
    """Link the distribution's top-level entries (inside a namespace package, its own entries only)."""
    origin = Path(str(dist.locate_file("")))
    for entry in {_entry(origin, Path(str(f))) for f in dist.files or [] if not str(f).startswith(("..", "__pycache__"))}:
        target = site / entry
        if not target.exists():
            target.parent.mkdir(parents=True, exist_ok=True)
            target.symlink_to(origin / entry)


def _entry(origin: Path, file: Path) -> Path:
    """The path to link for one of a distribution's files: its top-level entry, or one level deeper inside a
    namespace package (``google/``, which protobuf shares with other distributions)."""
    top = Path(file.parts[0])
    package = origin / top
    namespace = len(file.parts) > 2 and package.is_dir() and not (package / "__init__.py").exists() and "." not in top.name
    return top / file.parts[1] if namespace else top

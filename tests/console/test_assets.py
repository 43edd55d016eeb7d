"""The console's files: served from a closed list only, every module the pages import exists, and the
rollout page offers each action in exactly the statuses the lifecycle table accepts it."""

from __future__ import annotations

import re
from importlib import resources

import pytest

from edgectl.console import PREFIX, asset_names, console_asset
from edgectl.controller.lifecycle import DECISIONS, REQUESTS

STATIC = resources.files("edgectl.console").joinpath("static")


def test_every_file_is_served_with_its_type() -> None:
    names = asset_names()
    assert {"index.html", "app.js", "api.js", "style.css", "page_rollout.js"} <= names
    for name in names:
        asset = console_asset(PREFIX + name)
        assert asset is not None and asset.body == STATIC.joinpath(name).read_bytes(), name
    index = console_asset(PREFIX)
    assert index is not None and index.name == "index.html" and index.content_type.startswith("text/html")
    js = console_asset(PREFIX + "app.js")
    assert js is not None and js.content_type.startswith("text/javascript")  # ES modules need a JavaScript type
    assert js.etag != index.etag


@pytest.mark.parametrize("path", [
    "/console/../pyproject.toml", "/console/..%2f__init__.py", "/console/static/app.js", "/console/__init__.py",
    "/console/missing.js", "/console//etc/passwd", "/api/v1/me", "/consoleapp.js", "/console/app.js/",
])
def test_nothing_outside_the_list_is_served(path: str) -> None:
    assert console_asset(path) is None


def test_every_imported_module_and_linked_file_exists() -> None:
    names = asset_names()
    for name in sorted(n for n in names if n.endswith((".js", ".html"))):
        text = STATIC.joinpath(name).read_text()
        referenced = re.findall(r"""from\s+"\./([^"]+)"|(?:src|href)="([^"#:]+)\"""", text)
        for groups in referenced:
            target = next(g for g in groups if g)
            assert target in names, f"{name} refers to {target}, which the console does not serve"


def test_rollout_actions_follow_the_lifecycle_table() -> None:
    text = STATIC.joinpath("page_rollout.js").read_text()
    offered = {name: set(re.findall(r'"([a-z-]+)"', when))
               for name, when in re.findall(r'name: "([a-z-]+)", label: "[^"]+", when: \[([^\]]*)\]', text)}
    assert offered == {action: {s.value for s in statuses} for action, statuses in (*REQUESTS.items(), *DECISIONS.items())}

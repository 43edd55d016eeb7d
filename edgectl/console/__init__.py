"""The web console: static files (HTML, CSS, ES modules) that talk to ``/api/v1`` from the browser.

Nothing is built: the files under ``static/`` ship in the wheel as they are. Whatever serves the API
asks :func:`console_asset` for a path under :data:`PREFIX` and sends the bytes with
:data:`HEADERS`; anything else under the prefix is a 404. The console holds no secret: it keeps the
token the operator pastes in the browser's sessionStorage and sends it as a bearer token.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources

__all__ = ["HEADERS", "PREFIX", "Asset", "asset_names", "console_asset"]

PREFIX = "/console/"

TYPES = {
    ".html": "text/html; charset=utf-8",
    ".js": "text/javascript; charset=utf-8",
    ".css": "text/css; charset=utf-8",
    ".svg": "image/svg+xml",
    ".png": "image/png",
    ".ico": "image/x-icon",
}

# Scripts, styles and API calls from this origin only; no inline script, no framing.
HEADERS = {
    "Content-Security-Policy": "default-src 'self'; img-src 'self' data:; style-src 'self' 'unsafe-inline'; "
                               "frame-ancestors 'none'; base-uri 'none'; form-action 'self'",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-cache",
}


@dataclass(frozen=True)
class Asset:
    """One file of the console: its bytes, MIME type and an ETag (its content hash)."""

    name: str
    body: bytes
    content_type: str

    @property
    def etag(self) -> str:
        return '"' + hashlib.sha256(self.body).hexdigest()[:20] + '"'


@lru_cache(maxsize=1)
def asset_names() -> frozenset[str]:
    """Every file the console serves (names without folders: the static folder is flat)."""
    folder = resources.files(__package__).joinpath("static")
    return frozenset(p.name for p in folder.iterdir() if p.is_file() and _type(p.name) is not None)


def _type(name: str) -> str | None:
    dot = name.rfind(".")
    return TYPES.get(name[dot:]) if dot > 0 else None


@lru_cache(maxsize=64)
def _read(name: str) -> bytes:
    return resources.files(__package__).joinpath("static", name).read_bytes()


def console_asset(path: str) -> Asset | None:
    """The file for a request path (``/console/``, ``/console/app.js``), or None: only known names, no folders."""
    if path in ("/console", PREFIX[:-1]):
        path = PREFIX
    if not path.startswith(PREFIX):
        return None
    name = path[len(PREFIX):].split("?", 1)[0] or "index.html"
    if name not in asset_names():  # a closed list: "..", "%2e" or a folder never reach the file system
        return None
    content_type = _type(name)
    assert content_type is not None
    return Asset(name, _read(name), content_type)

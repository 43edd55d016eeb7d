"""Artifact URLs as the operator gives them (``--artifact-url``) and as each desired state carries them.

A URL names the payload's bytes. In a rollout with several packages (one per target), each URL
must contain ``{artifact_id}``, replaced by each package's payload sha256, so every device gets the
URLs of its own variant; with one package a URL may be used as is (a presigned S3 URL, say).
"""

from __future__ import annotations

import urllib.parse
from collections.abc import Sequence

from edgecore.errors import UserError
from edgecore.protocol.messages import MAX_ARTIFACT_URLS

__all__ = ["PLACEHOLDER", "check_artifact_urls", "urls_for"]

PLACEHOLDER = "{artifact_id}"


def check_artifact_urls(urls: Sequence[str], packages: int) -> tuple[str, ...]:
    """The URLs, checked: http(s), at most 16, with ``{artifact_id}`` when there are several packages."""
    if len(urls) > MAX_ARTIFACT_URLS:
        raise UserError(f"--artifact-url: at most {MAX_ARTIFACT_URLS} URLs, got {len(urls)}")
    for url in urls:
        parts = urllib.parse.urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname or any(c.isspace() for c in url):
            raise UserError(f"--artifact-url {url!r}: expected an http:// or https:// URL with a host and no spaces")
        if packages > 1 and PLACEHOLDER not in url:
            raise UserError(f"--artifact-url {url!r}: with {packages} packages each URL needs {PLACEHOLDER} "
                            "(replaced by each package's payload sha256)")
    return tuple(urls)


def urls_for(templates: Sequence[str], artifact_id: str) -> tuple[str, ...]:
    """The URLs of one artifact: ``{artifact_id}`` replaced by its payload sha256."""
    return tuple(url.replace(PLACEHOLDER, artifact_id) for url in templates)

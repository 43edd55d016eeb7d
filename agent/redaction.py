"""Secrets out of log text before it leaves the device: one table of patterns, applied in order.

Each pattern keeps what says what the secret was (``Bearer``, the key's name, the URL's scheme) and
replaces the secret itself with :data:`REDACTED`. Over-redacting a line is acceptable; sending a
secret is not.
"""

from __future__ import annotations

import re
from collections.abc import Callable

__all__ = ["PATTERNS", "REDACTED", "redact"]

REDACTED = "[REDACTED]"

_SECRET_NAME = re.compile(r"token|secret|passw(?:or)?d|pwd|key", re.IGNORECASE)


def _secret_value(match: re.Match[str]) -> str:
    """``name=value`` with the value redacted when the name says it holds a secret; else the text as it was."""
    return f"{match.group(1)}{REDACTED}" if _SECRET_NAME.search(match.group(2)) else match.group(0)


# (what it catches, the pattern, the replacement): the order matters: a PEM block before the key=value rule reads into it.
PATTERNS: tuple[tuple[str, re.Pattern[str], str | Callable[[re.Match[str]], str]], ...] = (
    ("private key PEM block",
     re.compile(r"-----BEGIN ([A-Z0-9 ]*)PRIVATE KEY-----.*?(?:-----END \1PRIVATE KEY-----|\Z)", re.DOTALL),
     f"-----BEGIN \\1PRIVATE KEY----- {REDACTED} -----END \\1PRIVATE KEY-----"),
    ("URL credentials user:pass@",
     re.compile(r"\b([A-Za-z][A-Za-z0-9+.-]{0,31}://)[^/\s:@]+:[^/\s@]*@"), f"\\1{REDACTED}@"),
    ("bearer token", re.compile(r"\b(bearer)\s+[A-Za-z0-9._~+/=-]+", re.IGNORECASE), f"\\1 {REDACTED}"),
    ("value of a key named like token, secret, password or key",
     # The name starts where no name character precedes it and is at most 64 long: linear in the line's length
     # (an unanchored name such as [\w.-]*token backtracks quadratically over a long word). _secret_value checks the name.
     re.compile(r"""(?<![\w.-])(["']?([\w.-]{1,64})["']?\s*[:=]\s*)("[^"]*"|'[^']*'|[^\s,;&}\]]+)"""),
     _secret_value),
)


def redact(text: str) -> str:
    """``text`` with every secret the patterns know replaced by :data:`REDACTED`."""
    for _, pattern, replacement in PATTERNS:
        text = pattern.sub(replacement, text)
    return text

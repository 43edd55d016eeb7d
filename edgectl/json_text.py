"""JSON text for the store and the REST API: a NaN or infinity (a device may report one) becomes null.

Strict JSON has no NaN; SQL JSON functions and browsers refuse text that carries one.
"""

from __future__ import annotations

import json
import math
from typing import Any

__all__ = ["dumps"]


def dumps(value: Any) -> str:
    """Compact JSON text of ``value``, every non-finite float as null."""
    try:
        return json.dumps(value, separators=(",", ":"), default=str, allow_nan=False)
    except ValueError:
        return json.dumps(_finite(value), separators=(",", ":"), default=str)


def _finite(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value

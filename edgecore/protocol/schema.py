"""Reading JSON payloads field by field, with errors that name the field."""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from edgecore.errors import ProtocolError

__all__ = ["MAX_JSON_BYTES", "SCHEMA_VERSION", "Fields", "decode_json", "encode_json"]

SCHEMA_VERSION = 1
MAX_JSON_BYTES = 1024 * 1024

T = TypeVar("T")


def decode_json(raw: bytes, what: str, max_bytes: int = MAX_JSON_BYTES,
                schemas: tuple[int, ...] = (SCHEMA_VERSION,)) -> Fields:
    """Parse a JSON object payload whose ``"schema"`` is one of ``schemas`` (1 for all but the desired state)."""
    if len(raw) > max_bytes:
        raise ProtocolError(f"{what}: payload of {len(raw)} bytes exceeds the {max_bytes} byte limit")
    try:
        data = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise ProtocolError(f"{what}: malformed JSON ({exc})") from exc
    except RecursionError as exc:  # json recurses per nesting level: '[' * 100000 blows the stack
        raise ProtocolError(f"{what}: JSON nested too deeply") from exc
    fields = Fields(data, what)
    schema = fields.integer("schema")
    if schema not in schemas:
        spoken = ", ".join(map(str, schemas))
        raise ProtocolError(f"{what}: unsupported schema version {schema} (this agent speaks {spoken})")
    return fields


def encode_json(data: Mapping[str, Any], schema: int = SCHEMA_VERSION) -> bytes:
    return json.dumps({"schema": schema, **data}, separators=(",", ":"), allow_nan=False).encode()


class Fields:
    """A JSON object whose fields are read with type checks naming ``what.field``.

    Readers are named after JSON's types (text, integer, number, boolean, array, obj) so that none
    shadows a builtin inside the class body."""

    def __init__(self, data: Any, what: str) -> None:
        if not isinstance(data, dict):
            raise ProtocolError(f"{what}: expected a JSON object, got {type(data).__name__}")
        self.data: dict[str, Any] = data
        self.what = what

    def _get(self, key: str, kind: type[T] | tuple[type, ...]) -> Any:
        """The field's value, of ``kind``; ProtocolError naming the field when it is missing, null or of another type.

        The ``opt_*`` readers return None for a missing or null field before they get here."""
        if key not in self.data or self.data[key] is None:
            raise ProtocolError(f"{self.what}: missing field {key!r}")
        value = self.data[key]
        # bool is an int in Python; never accept it where a number is asked for.
        if isinstance(value, bool) and kind is not bool:
            raise ProtocolError(f"{self.what}.{key}: expected {_name(kind)}, got bool")
        if not isinstance(value, kind):
            raise ProtocolError(f"{self.what}.{key}: expected {_name(kind)}, got {type(value).__name__}")
        return value

    def text(self, key: str, max_len: int = 1024) -> str:
        value: str = self._get(key, str)
        if len(value) > max_len:
            raise ProtocolError(f"{self.what}.{key}: longer than {max_len} characters")
        return value

    def opt_text(self, key: str, max_len: int = 1024) -> str | None:
        return None if self.data.get(key) is None else self.text(key, max_len)

    def integer(self, key: str, minimum: int = 0, maximum: int = 2**63 - 1) -> int:
        value: int = self._get(key, int)
        if not minimum <= value <= maximum:
            raise ProtocolError(f"{self.what}.{key}: {value} is outside [{minimum}, {maximum}]")
        return value

    def number(self, key: str) -> float:
        value = self._get(key, (int, float))
        # An int too large for a float (10**400) would raise OverflowError in isfinite.
        if (isinstance(value, int) and abs(value) > 2**1023) or not math.isfinite(value):
            raise ProtocolError(f"{self.what}.{key}: not a finite number")
        return float(value)

    def opt_number(self, key: str) -> float | None:
        return None if self.data.get(key) is None else self.number(key)

    def opt_integer(self, key: str, minimum: int = 0, maximum: int = 2**63 - 1) -> int | None:
        return None if self.data.get(key) is None else self.integer(key, minimum, maximum)

    def boolean(self, key: str) -> bool:
        value: bool = self._get(key, bool)
        return value

    def array(self, key: str, max_len: int = 100_000) -> list[Any]:
        value: list[Any] = self._get(key, list)
        if len(value) > max_len:
            raise ProtocolError(f"{self.what}.{key}: more than {max_len} entries")
        return value

    def obj(self, key: str) -> Fields:
        return Fields(self._get(key, dict), f"{self.what}.{key}")

    def opt_obj(self, key: str) -> Fields | None:
        return None if self.data.get(key) is None else self.obj(key)

    def raw_obj(self, key: str) -> dict[str, Any]:
        value: dict[str, Any] = self._get(key, dict)
        return value

    def opt_raw_obj(self, key: str) -> dict[str, Any] | None:
        return None if self.data.get(key) is None else self.raw_obj(key)

    def entries(self, key: str, read: Callable[[Fields, str], T]) -> dict[str, T]:
        """An object whose every value ``read`` accepts (``Fields.text``, ``Fields.number``, ...); absent reads as empty."""
        inner = self.opt_obj(key)
        return {} if inner is None else {name: read(inner, name) for name in inner.data}


def _name(kind: Any) -> str:
    if isinstance(kind, tuple):
        return " or ".join(k.__name__ for k in kind)
    return str(kind.__name__)

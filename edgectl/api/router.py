"""The REST API's route table, requests, responses and errors: one table feeds dispatch and the OpenAPI document.

A :class:`Route` names its method, path template (``/api/v1/rollouts/{rollout_id}``), the least
role that may call it (None: open), its query parameters and its JSON body schema. Dispatch checks
the query and body against the same declarations the document shows, so the two cannot drift.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from edgectl.api.accounts import Principal
from edgectl.controller.accounts import Role

__all__ = ["MAX_DEPTH", "MAX_INT", "ApiError", "Param", "Request", "Response", "Route", "Router", "check_body", "check_query",
           "read_json"]

MAX_INT = 2**63 - 1  # the largest integer the store and the wire take
MAX_DEPTH = 32  # arrays and objects nested in a request body
JSON_TYPES: dict[str, tuple[type, ...]] = {
    "string": (str,), "integer": (int,), "number": (int, float), "boolean": (bool,), "array": (list,), "object": (dict,),
}


class ApiError(Exception):
    """An answer other than success: status, a one-line message, and the field at fault when there is one."""

    def __init__(self, status: int, message: str, field: str | None = None, headers: Mapping[str, str] | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.field = status, message, field
        self.headers = dict(headers or {})

    def body(self) -> dict[str, Any]:
        error: dict[str, Any] = {"status": self.status, "message": self.message}
        if self.field is not None:
            error["field"] = self.field
        return {"error": error}


@dataclass(frozen=True)
class Param:
    """A query parameter: ``type`` is a JSON schema type of one value (``repeat``: may be given several times)."""

    name: str
    type: str
    description: str
    minimum: int | None = None
    maximum: int | None = None
    enum: tuple[str, ...] = ()
    repeat: bool = False
    default: Any = None

    def __post_init__(self) -> None:
        if self.type == "integer" and (self.minimum is None or self.maximum is None):
            raise TypeError(f"query parameter {self.name!r}: an integer needs a minimum and a maximum")


@dataclass
class Request:
    method: str
    path: str
    path_params: dict[str, str]
    query: dict[str, list[str]]
    headers: Mapping[str, str]
    body: bytes = b""
    upload: Path | None = None  # routes with ``upload``: the streamed body, in a temporary file
    principal: Principal | None = None
    values: dict[str, Any] = field(default_factory=dict)  # checked query values by name

    @property
    def actor(self) -> str:
        return self.principal.actor if self.principal else "api:anonymous"


@dataclass(frozen=True)
class Response:
    status: int
    body: Any  # JSON-ready data, or bytes with ``content_type``
    content_type: str = "application/json"
    headers: Mapping[str, str] = field(default_factory=dict)


Handler = Callable[[Request], Response]


@dataclass(frozen=True)
class Route:
    method: str
    path: str
    role: Role | None
    summary: str
    handler: Handler
    params: tuple[Param, ...] = ()
    body: dict[str, Any] | None = None  # JSON schema of the request body
    upload: str | None = None  # media type of a raw body streamed to a file (a package upload)
    responses: Mapping[int, str] = field(default_factory=lambda: {200: "OK"})
    tag: str = ""
    answer: dict[str, Any] | None = None  # JSON schema of the success answer (the document shows it)

    @property
    def pattern(self) -> re.Pattern[str]:
        return re.compile("^" + re.sub(r"\{(\w+)\}", r"(?P<\1>[^/]+)", self.path) + "$")

    @property
    def path_names(self) -> list[str]:
        return re.findall(r"\{(\w+)\}", self.path)


class Router:
    """Finds the route of a method and path: 404 for no path, 405 (with Allow) for another method."""

    def __init__(self, routes: list[Route]) -> None:
        self.routes = routes
        self._compiled = [(r, r.pattern) for r in routes]

    def match(self, method: str, path: str) -> tuple[Route, dict[str, str]]:
        """The route of ``method`` on ``path``; HEAD is answered by the GET route (the server sends no body)."""
        allowed = []
        wanted = "GET" if method == "HEAD" else method
        for route, pattern in self._compiled:
            found = pattern.match(path)
            if found is None:
                continue
            if route.method == wanted:
                return route, found.groupdict()
            allowed.append(route.method)
        if allowed:
            raise not_allowed(method, path, allowed)
        raise ApiError(404, f"no such endpoint: {path} (see /api/v1/openapi.json)")


def not_allowed(method: str, path: str, methods: list[str]) -> ApiError:
    """405 with ``Allow`` (RFC 9110 15.5.6); HEAD goes wherever GET does."""
    allowed = sorted(set(methods) | ({"HEAD"} if "GET" in methods else set()))
    return ApiError(405, f"{method} is not allowed on {path} (allowed: {', '.join(allowed)})",
                    headers={"Allow": ", ".join(allowed)})


def check_query(params: tuple[Param, ...], query: dict[str, list[str]]) -> dict[str, Any]:
    """The query's values by the route's declarations; 400 naming the parameter that is wrong or unknown."""
    known = {p.name: p for p in params}
    for name in query:
        if name not in known:
            raise ApiError(400, f"unknown query parameter {name!r} (known: {', '.join(known) or 'none'})", name)
    values: dict[str, Any] = {}
    for p in params:
        given = query.get(p.name, [])
        if len(given) > 1 and not p.repeat:
            raise ApiError(400, f"query parameter {p.name!r} given {len(given)} times", p.name)
        parsed = [_query_value(p, v) for v in given]
        values[p.name] = parsed if p.repeat else parsed[0] if parsed else p.default
    return values


def _query_value(p: Param, text: str) -> Any:
    if p.type == "integer":
        digits = text.strip().removeprefix("-")
        if not (digits.isascii() and digits.isdigit()):
            raise ApiError(400, f"query parameter {p.name!r}: {text[:40]!r} is not an integer", p.name)
        assert p.minimum is not None and p.maximum is not None  # Param requires both of an integer
        value = int(text) if len(digits) <= 20 else None  # longer is out of any range (int() of 5,000 digits is slow)
        if value is None or not p.minimum <= value <= p.maximum:
            raise ApiError(400, f"query parameter {p.name!r}: {text.strip()[:24]} is outside {p.minimum}..{p.maximum}",
                           p.name)
        return value
    if p.type == "boolean":
        if text not in ("true", "false"):
            raise ApiError(400, f"query parameter {p.name!r}: expected true or false", p.name)
        return text == "true"
    if p.enum and text not in p.enum:
        raise ApiError(400, f"query parameter {p.name!r}: {text!r} is not one of {', '.join(p.enum)}", p.name)
    return text


def check_body(schema: Mapping[str, Any], value: Any, where: str = "") -> None:
    """Check ``value`` against a small JSON schema subset (type, properties, required, items, enum, bounds,
    additionalProperties false); 400 naming the first field at fault."""
    name = where or "body"
    kind = schema.get("type")
    if kind is not None and (not isinstance(value, JSON_TYPES[kind]) or (kind != "boolean" and isinstance(value, bool))):
        raise ApiError(400, f"{name}: expected {'an' if kind[0] in 'aeiou' else 'a'} {kind}", where or None)
    if "enum" in schema and value not in schema["enum"]:
        raise ApiError(400, f"{name}: {value!r} is not one of {', '.join(map(str, schema['enum']))}", where or None)
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        if "minimum" in schema and value < schema["minimum"]:
            raise ApiError(400, f"{name}: must be at least {schema['minimum']}", where or None)
        if "maximum" in schema and value > schema["maximum"]:
            raise ApiError(400, f"{name}: must be at most {schema['maximum']}", where or None)
    if isinstance(value, str) and "minLength" in schema and len(value) < schema["minLength"]:
        raise ApiError(400, f"{name}: must not be empty", where or None)
    if isinstance(value, list):
        if "minItems" in schema and len(value) < schema["minItems"]:
            raise ApiError(400, f"{name}: needs at least {schema['minItems']} item(s)", where or None)
        for i, item in enumerate(value):
            check_body(schema.get("items", {}), item, f"{name}[{i}]")
    if isinstance(value, dict):
        properties = schema.get("properties", {})
        for key in schema.get("required", ()):
            if key not in value:
                raise ApiError(400, f"{_join(where, key)}: required", _join(where, key))
        for key, item in value.items():
            if key not in properties and schema.get("additionalProperties") is False:
                raise ApiError(400, f"{_join(where, key)}: unknown field (known: {', '.join(properties)})", _join(where, key))
            if key in properties:
                check_body(properties[key], item, _join(where, key))


def _join(where: str, key: str) -> str:
    return f"{where}.{key}" if where else key


def read_json(raw: bytes) -> Any:
    """A request body's JSON: finite numbers only, at most :data:`MAX_DEPTH` levels deep; 400 otherwise."""
    try:
        value = json.loads(raw, parse_constant=_no_constant, parse_float=_finite, parse_int=_bounded) if raw else None
    except RecursionError:
        raise ApiError(400, f"body: nested deeper than {MAX_DEPTH} levels") from None
    except (ValueError, UnicodeDecodeError):
        raise ApiError(400, "body: not valid JSON") from None
    if _depth(value) > MAX_DEPTH:
        raise ApiError(400, f"body: nested deeper than {MAX_DEPTH} levels")
    return value


def _no_constant(token: str) -> Any:
    raise ApiError(400, f"body: {token} is not a number (JSON has no NaN or Infinity)")


def _finite(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ApiError(400, f"body: the number {text[:40]} is out of range")
    return value


def _bounded(text: str) -> int:
    if len(text.lstrip("-")) > 19:
        raise ApiError(400, f"body: the number {text[:40]} is out of range")
    return int(text)


def _depth(value: Any, level: int = 1) -> int:
    """How deep arrays and objects nest in ``value`` (stops counting past :data:`MAX_DEPTH`)."""
    if level > MAX_DEPTH or not isinstance(value, (list, dict)):
        return level - (not isinstance(value, (list, dict)))
    items = value.values() if isinstance(value, dict) else value
    return max((_depth(item, level + 1) for item in items), default=level)

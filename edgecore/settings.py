"""Typed settings from YAML, environment and flags, with errors that name the file and key.

A settings class is a frozen dataclass whose fields are str, int, float, bool, Path, Optional of
those, list[str], dict[str, str] or another settings dataclass. Sources apply in order: defaults,
the YAML file, environment variables ``<PREFIX><KEY>`` (nested keys joined by ``__``), then
``key.sub=value`` overrides from the command line.
"""

from __future__ import annotations

import dataclasses
import os
import types
import typing
from collections.abc import Mapping
from pathlib import Path
from typing import Any, TypeVar, Union

import yaml

from edgecore.errors import ConfigError

__all__ = ["load_settings", "parse_override"]

S = TypeVar("S")


def load_settings(
    cls: type[S],
    path: Path | None,
    env_prefix: str,
    overrides: Mapping[str, str] = {},
    environ: Mapping[str, str] = os.environ,
) -> S:
    """Build ``cls`` from a YAML file, the environment and overrides; raise ConfigError naming the key."""
    data: dict[str, Any] = {}
    where = "defaults"
    if path is not None:
        data = _read_yaml(path)
        where = str(path)
    base = path.parent if path is not None else Path.cwd()
    for key, value in _env_items(env_prefix, environ):
        _set(data, key, value)
    for key, value in overrides.items():
        _set(data, key, value)
    return _build(cls, data, where, "", base)


def parse_override(text: str) -> tuple[str, str]:
    """Split ``key.sub=value`` as given to ``--set``."""
    key, sep, value = text.partition("=")
    if not sep or not key.strip():
        raise ConfigError(f"--set {text!r}: expected KEY=VALUE, e.g. inference.port=8081")
    return key.strip(), value


def _read_yaml(path: Path) -> dict[str, Any]:
    try:
        raw = path.read_text()
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read config ({exc.strerror})") from exc
    try:
        data = yaml.safe_load(raw)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        at = f" at line {mark.line + 1}" if mark is not None else ""
        raise ConfigError(f"{path}: invalid YAML{at}") from exc
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: top level must be a mapping of keys")
    return data


def _env_items(prefix: str, environ: Mapping[str, str]) -> list[tuple[str, str]]:
    return [
        (name[len(prefix):].lower().replace("__", "."), value)
        for name, value in environ.items()
        if name.startswith(prefix) and len(name) > len(prefix)
    ]


def _set(data: dict[str, Any], dotted: str, value: Any) -> None:
    *parents, leaf = dotted.split(".")
    node = data
    for part in parents:
        child = node.setdefault(part, {})
        if not isinstance(child, dict):
            raise ConfigError(f"{dotted}: {part} is not a section")
        node = child
    node[leaf] = value


def _build(cls: type[S], data: Any, where: str, prefix: str, base: Path) -> S:
    if not isinstance(data, dict):
        raise ConfigError(f"{where}: {prefix.rstrip('.') or 'top level'} must be a mapping")
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    unknown = sorted(set(data) - set(fields))
    if unknown:
        raise ConfigError(f"{where}: unknown key {prefix}{unknown[0]} (known: {', '.join(sorted(fields))})")
    values = {}
    for name, value in data.items():
        values[name] = _convert(hints[name], value, where, f"{prefix}{name}", base)
    try:
        return cls(**values)
    except TypeError as exc:
        missing = [n for n, f in fields.items() if n not in values and f.default is dataclasses.MISSING
                   and f.default_factory is dataclasses.MISSING]
        raise ConfigError(f"{where}: missing required key {prefix}{missing[0] if missing else '?'}") from exc


def _convert(hint: Any, value: Any, where: str, key: str, base: Path) -> Any:
    origin = typing.get_origin(hint)
    if origin in (Union, types.UnionType):
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        if value is None or value == "":
            return None
        return _convert(args[0], value, where, key, base)
    if dataclasses.is_dataclass(hint):
        return _build(hint, value, where, key + ".", base)  # type: ignore[arg-type]
    if origin is list:
        items = value.split(",") if isinstance(value, str) else value
        if not isinstance(items, list):
            raise ConfigError(f"{where}: {key} must be a list")
        return [_convert(typing.get_args(hint)[0], v, where, f"{key}[{i}]", base) for i, v in enumerate(items)]
    if origin is dict:
        if isinstance(value, str):
            value = dict(p.split("=", 1) for p in value.split(",") if "=" in p)
        if not isinstance(value, dict):
            raise ConfigError(f"{where}: {key} must be a mapping")
        return {str(k): str(v) for k, v in value.items()}
    return _scalar(hint, value, where, key, base)


def _scalar(hint: Any, value: Any, where: str, key: str, base: Path) -> Any:
    try:
        if hint is bool:
            if isinstance(value, bool):
                return value
            if str(value).lower() in ("1", "true", "yes", "on"):
                return True
            if str(value).lower() in ("0", "false", "no", "off"):
                return False
            raise ValueError(value)
        if hint is Path:
            path = Path(os.path.expanduser(str(value)))
            return path if path.is_absolute() else base / path
        if hint in (int, float) and isinstance(value, bool):
            raise ValueError(value)
        if hint in (int, float, str):
            return hint(value)
    except (TypeError, ValueError):
        raise ConfigError(f"{where}: {key} must be {getattr(hint, '__name__', hint)}, got {value!r}") from None
    raise ConfigError(f"{where}: {key}: unsupported setting type {hint}")

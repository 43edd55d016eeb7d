"""What a target profile needs from a device's runtimes: per execution provider, the runtime, its versions, and
what to install when the device lacks it.

Both sides read these keys of ``configs/targets/*.yaml``: ``targets.profile`` validates them when the host
loads a profile, and the agent reads them from the same files (installed with it) to say, per profile,
whether the runtimes it has can run that target (``edge-agent probe``, the birth message). A version range
is a comma-separated list of ``>=``, ``>``, ``<=``, ``<``, ``==`` bounds on dotted numbers.
"""

from __future__ import annotations

import operator
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from edgecore.errors import ConfigError

__all__ = ["ProfileNeeds", "RuntimeNeed", "default_install", "need_of", "range_problem", "read_profile_needs", "version_matches"]

_BOUND = re.compile(r"^\s*(>=|<=|==|>|<)\s*(\d+(?:\.\d+)*)\s*$")
_OPS: dict[str, Callable[[tuple[int, ...], tuple[int, ...]], bool]] = {
    ">=": operator.ge, "<=": operator.le, "==": operator.eq, ">": operator.gt, "<": operator.lt,
}


@dataclass(frozen=True)
class RuntimeNeed:
    """One execution provider of a profile as a runtime requirement.

    ``device`` is the OpenVINO device whose plugin the runtime must have (``runtime: openvino`` only);
    for onnxruntime the build must offer ``provider`` itself."""

    provider: str
    runtime: str
    versions: str
    install: str
    device: str | None = None

    @property
    def accelerator(self) -> bool:
        return self.provider != "CPUExecutionProvider"

    def to_dict(self) -> dict[str, Any]:
        return {"provider": self.provider, "runtime": self.runtime, "versions": self.versions, "install": self.install,
                **({"device": self.device} if self.device else {})}


@dataclass(frozen=True)
class ProfileNeeds:
    """A profile's runtime requirements, in provider order; ``unsupported`` when no ONNX runtime drives it."""

    name: str
    needs: tuple[RuntimeNeed, ...]
    unsupported: str | None = None


def default_install(runtime: str, versions: str) -> str:
    """The install line for a runtime's plain PyPI build (what a profile that says nothing else needs)."""
    package = {"onnxruntime": "onnxruntime", "openvino": "openvino"}.get(runtime, runtime)
    return f"pip install '{package}{versions.replace(' ', '')}'"


def range_problem(spec: str) -> str | None:
    """Why ``spec`` is not a version range this module reads; None when it is one."""
    bad = [part for part in spec.split(",") if not _BOUND.match(part)]
    return f"{bad[0].strip()!r} is not a bound like >=1.16 or <2023.0" if bad else None


def version_matches(version: str, spec: str) -> bool:
    """Whether ``version`` (``2022.3.1``, ``1.32.0``, ``2026.4.1-1234-abc``) is inside ``spec``.

    Versions compare as numbers, padded with zeros: 2022.3.1 is above ``<=2022.3``, so a range for
    every 2022.3 release says ``<2023.0``."""
    have = _numbers(version)
    for part in spec.split(","):
        match = _BOUND.match(part)
        if match is None:
            raise ConfigError(f"version range {spec!r}: {range_problem(spec)}")
        want = _numbers(match.group(2))
        width = max(len(have), len(want))
        if not _OPS[match.group(1)](have + (0,) * (width - len(have)), want + (0,) * (width - len(want))):
            return False
    return True


def read_profile_needs(path: Path) -> ProfileNeeds:
    """The runtime requirements of the profile file at ``path``; ConfigError naming the file and key."""
    import yaml

    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as exc:
        raise ConfigError(f"{path}: cannot read profile: {str(exc).splitlines()[0]}") from exc
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: key '<top>': must be a mapping")
    unsupported = data.get("unsupported")
    reason = f"{unsupported.get('runtime')}: {unsupported.get('reason')}" if isinstance(unsupported, dict) else None
    providers = data.get("execution_providers") or []
    if not isinstance(providers, list):
        raise ConfigError(f"{path}: key 'execution_providers': must be a list")
    needs = tuple(need_of(path, f"execution_providers[{i}].", p) for i, p in enumerate(providers))
    return ProfileNeeds(str(data.get("name", path.stem)), needs, reason)


def need_of(path: Path, prefix: str, data: Any) -> RuntimeNeed:
    """One provider entry as a RuntimeNeed (``prefix`` is its dotted key, for errors)."""
    if not isinstance(data, Mapping):
        raise ConfigError(f"{path}: key '{prefix.rstrip('.')}': must be a mapping")
    values = {}
    for key in ("name", "runtime", "versions"):
        value = data.get(key)
        if not isinstance(value, str) or not value:
            raise ConfigError(f"{path}: key '{prefix}{key}': must be a non-empty string, got {value!r}")
        values[key] = value
    problem = range_problem(values["versions"])
    if problem:
        raise ConfigError(f"{path}: key '{prefix}versions': {problem}")
    install = data.get("install", default_install(values["runtime"], values["versions"]))
    if not isinstance(install, str) or not install:
        raise ConfigError(f"{path}: key '{prefix}install': must be a non-empty string, got {install!r}")
    support = data.get("op_support")
    device = support.get("device") if isinstance(support, Mapping) and values["runtime"] == "openvino" else None
    return RuntimeNeed(values["name"], values["runtime"], values["versions"], install, str(device) if device else None)


def _numbers(version: str) -> tuple[int, ...]:
    match = re.match(r"\d+(?:\.\d+)*", version.strip())
    if match is None:
        raise ConfigError(f"version {version!r} does not start with a number")
    return tuple(int(n) for n in match.group(0).split("."))

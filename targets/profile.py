"""Target profiles: frozen, validated data loaded from ``configs/targets/*.yaml``.

Search order (a later directory overrides a profile of the same name from an earlier one):
the built-in ``configs/targets``, ``~/.config/edgectl/targets``, then each directory in
``EDGECTL_TARGETS_PATH`` (``os.pathsep``-separated). Every validation error names the file and key.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from edgecore.errors import ConfigError, NotFoundError
from edgecore.runtimes import RuntimeNeed, need_of

__all__ = [
    "BUILTIN_DIR",
    "ExecutionProvider",
    "OpSupport",
    "PartitionLimits",
    "PrecisionPolicy",
    "ShapePolicy",
    "TargetProfile",
    "Unsupported",
    "list_profiles",
    "load_profile",
    "load_profile_file",
    "profile_dirs",
]

BUILTIN_DIR = Path(__file__).resolve().parents[1] / "configs" / "targets"

# Where op-support knowledge can come from; each is implemented in targets/support.py.
OP_SUPPORT_SOURCES = ("ort-cpu", "ort-mobile-nnapi", "ort-mobile-coreml-neuralnetwork", "ort-mobile-coreml-mlprogram",
                      "openvino", "table", "all-except")
PRECISION_FORMATS = ("fp32", "fp16", "int8-qdq-symmetric", "uint8-qdq", "uint8-uint16-qdq", "int8-full-integer")


@dataclass(frozen=True)
class OpSupport:
    """Where an execution provider's operator support is decided."""

    source: str
    table: str | None = None  # table file name (next to the profile) for source "table"
    table_version: str | None = None  # version key inside the table
    device: str | None = None  # OpenVINO device for source "openvino"
    excluded_ops: tuple[str, ...] = ()  # "domain:Op" the EP never takes (ORT's own exclusions)
    excluded_domains: tuple[str, ...] = ()
    require_static_inputs: bool = False


@dataclass(frozen=True)
class ExecutionProvider:
    """One execution provider of a profile, in priority order."""

    name: str
    runtime: str
    versions: str  # runtime version range, e.g. ">=1.16,<2"
    op_support: OpSupport
    accelerator: bool
    options: Mapping[str, str] = field(default_factory=dict)  # provider options the analysis assumes
    install: str = ""  # what a device installs when its runtime cannot run this provider (edgecore.runtimes)

    def need(self) -> RuntimeNeed:
        """This provider as a runtime requirement (what ``edge-agent probe`` checks on the device)."""
        return RuntimeNeed(self.name, self.runtime, self.versions, self.install,
                           self.op_support.device if self.runtime == "openvino" else None)


@dataclass(frozen=True)
class PrecisionPolicy:
    """The numeric format the target needs; the quantize helper reads this."""

    format: str
    activations: str
    weights: str
    notes: str = ""


@dataclass(frozen=True)
class ShapePolicy:
    """Whether inputs must be static, and default static shapes (input name -> dims)."""

    static_required: bool
    default_static_shapes: Mapping[str, tuple[int, ...]] = field(default_factory=dict)


@dataclass(frozen=True)
class PartitionLimits:
    """Fragmentation policy for accelerator partitions."""

    max_partitions: int
    min_partition_nodes: int


@dataclass(frozen=True)
class Unsupported:
    """A target no ONNX runtime here can drive: why, and the path users take instead."""

    runtime: str
    reason: str
    conversion: tuple[str, ...]


@dataclass(frozen=True)
class TargetProfile:
    """A deployment target: providers in order, precision, shapes, partition limits, notes."""

    name: str
    description: str
    execution_providers: tuple[ExecutionProvider, ...]
    precision: PrecisionPolicy
    shape: ShapePolicy
    partition: PartitionLimits
    notes: tuple[str, ...]
    source_file: Path
    unsupported: Unsupported | None = None

    @property
    def accelerator_providers(self) -> tuple[ExecutionProvider, ...]:
        """Providers that are not the CPU fallback."""
        return tuple(ep for ep in self.execution_providers if ep.accelerator)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form (for `edgectl targets show --json` and reports)."""
        return {
            "name": self.name,
            "description": self.description,
            "execution_providers": [
                {
                    "name": ep.name,
                    "runtime": ep.runtime,
                    "versions": ep.versions,
                    "install": ep.install,
                    "accelerator": ep.accelerator,
                    "options": dict(ep.options),
                    "op_support": {k: v for k, v in vars(ep.op_support).items() if v not in (None, (), False)},
                }
                for ep in self.execution_providers
            ],
            "precision": vars(self.precision),
            "shape": {
                "static_required": self.shape.static_required,
                "default_static_shapes": {k: list(v) for k, v in self.shape.default_static_shapes.items()},
            },
            "partition": vars(self.partition),
            "notes": list(self.notes),
            "source_file": str(self.source_file),
            **({"unsupported": {"runtime": self.unsupported.runtime, "reason": self.unsupported.reason,
                                "conversion": list(self.unsupported.conversion)}} if self.unsupported else {}),
        }


def profile_dirs() -> list[Path]:
    """Directories searched for profiles, lowest priority first."""
    dirs = [BUILTIN_DIR, Path.home() / ".config" / "edgectl" / "targets"]
    extra = os.environ.get("EDGECTL_TARGETS_PATH", "")
    dirs += [Path(p) for p in extra.split(os.pathsep) if p]
    return dirs


def _profile_files() -> dict[str, Path]:
    found: dict[str, Path] = {}
    for directory in profile_dirs():
        if not directory.is_dir():
            continue
        for file in sorted(directory.glob("*.yaml")):
            if not file.name.endswith("-ops.yaml"):  # op tables live beside profiles
                found[file.stem] = file
    return found


def list_profiles() -> list[TargetProfile]:
    """Every profile found, validated, sorted by name."""
    return [load_profile_file(path) for _, path in sorted(_profile_files().items())]


def load_profile(name: str) -> TargetProfile:
    """The profile called ``name``; NotFoundError lists the known names."""
    files = _profile_files()
    if name not in files:
        raise NotFoundError(f"unknown target {name!r}; known: {', '.join(sorted(files)) or 'none'}")
    return load_profile_file(files[name])


def load_profile_file(path: Path) -> TargetProfile:
    """Load and validate one profile YAML file."""
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as exc:
        raise ConfigError(f"{path}: cannot read profile: {str(exc).splitlines()[0]}") from exc
    reader = _Reader(path, data if data is not None else {}, "")
    unsupported = _unsupported(reader.child("unsupported")) if "unsupported" in reader.data else None
    # a target no runtime here drives has no providers and no partitions to limit
    runnable = unsupported is None or "execution_providers" in reader.data
    profile = TargetProfile(
        name=reader.string("name"),
        description=reader.string("description"),
        execution_providers=tuple(_provider(r) for r in reader.items("execution_providers")) if runnable else (),
        precision=_precision(reader.child("precision")),
        shape=_shape(reader.child("shape")),
        partition=PartitionLimits(
            max_partitions=reader.child("partition").positive_int("max_partitions"),
            min_partition_nodes=reader.child("partition").positive_int("min_partition_nodes"),
        ) if runnable else PartitionLimits(max_partitions=1, min_partition_nodes=1),
        notes=tuple(reader.strings("notes", required=False)),
        source_file=path,
        unsupported=unsupported,
    )
    if profile.name != path.stem:
        raise ConfigError(f"{path}: key 'name': {profile.name!r} must match the file name {path.stem!r}")
    if not runnable:
        return profile
    if not profile.execution_providers or profile.execution_providers[-1].name != "CPUExecutionProvider":
        raise ConfigError(f"{path}: key 'execution_providers': the last provider must be CPUExecutionProvider")
    return profile


def _provider(r: _Reader) -> ExecutionProvider:
    support = r.child("op_support")
    source = support.choice("source", OP_SUPPORT_SOURCES)
    op_support = OpSupport(
        source=source,
        # "openvino" may name a table too: the fallback when the device plugin is absent
        table=support.string("table") if source == "table" or "table" in support.data else None,
        table_version=support.string("version") if source == "table" or "table" in support.data else None,
        device=support.string("device") if source == "openvino" else None,
        excluded_ops=tuple(support.strings("excluded_ops", required=False)),
        excluded_domains=tuple(support.strings("excluded_domains", required=False)),
        require_static_inputs=support.boolean("require_static_inputs", default=False),
    )
    name = r.string("name")
    need = need_of(r.path, r.prefix, r.data)  # the runtime keys, read as the device reads them
    return ExecutionProvider(
        name=name,
        runtime=r.string("runtime"),
        versions=r.string("versions"),
        op_support=op_support,
        accelerator=name != "CPUExecutionProvider",
        options=_options(r),
        install=need.install,
    )


def _unsupported(r: _Reader) -> Unsupported:
    return Unsupported(runtime=r.string("runtime"), reason=r.string("reason"),
                       conversion=tuple(r.strings("conversion")))


def _options(r: _Reader) -> dict[str, str]:
    raw = r.data.get("options") or {}
    if not isinstance(raw, dict) or not all(isinstance(v, (str, int)) and not isinstance(v, bool) for v in raw.values()):
        raise r.error("options", "must be a mapping of provider option name to a string value")
    return {str(k): str(v) for k, v in raw.items()}


def _precision(r: _Reader) -> PrecisionPolicy:
    return PrecisionPolicy(
        format=r.choice("format", PRECISION_FORMATS),
        activations=r.string("activations"),
        weights=r.string("weights"),
        notes=r.string("notes") if "notes" in r.data else "",
    )


def _shape(r: _Reader) -> ShapePolicy:
    defaults: dict[str, tuple[int, ...]] = {}
    raw = r.data.get("default_static_shapes") or {}
    if not isinstance(raw, dict):
        raise r.error("default_static_shapes", "must be a mapping of input name to a list of dims")
    for key, dims in raw.items():
        if not isinstance(dims, list) or not all(isinstance(d, int) and d > 0 for d in dims):
            raise r.error(f"default_static_shapes.{key}", "must be a list of positive integers")
        defaults[str(key)] = tuple(dims)
    return ShapePolicy(static_required=r.boolean("static_required"), default_static_shapes=defaults)


class _Reader:
    """Typed access to one YAML mapping; errors carry the file and the dotted key."""

    def __init__(self, path: Path, data: Any, prefix: str) -> None:
        self.path, self.prefix = path, prefix
        if not isinstance(data, dict):
            raise ConfigError(f"{path}: key '{prefix or '<top>'}': must be a mapping")
        self.data: dict[str, Any] = data

    def error(self, key: str, problem: str) -> ConfigError:
        return ConfigError(f"{self.path}: key '{self.prefix}{key}': {problem}")

    def _get(self, key: str) -> Any:
        if key not in self.data:
            raise self.error(key, "missing")
        return self.data[key]

    def string(self, key: str) -> str:
        value = self._get(key)
        if not isinstance(value, (str, int, float)) or isinstance(value, bool) or str(value) == "":
            raise self.error(key, f"must be a non-empty string, got {value!r}")
        return str(value)

    def choice(self, key: str, allowed: tuple[str, ...]) -> str:
        value = self.string(key)
        if value not in allowed:
            raise self.error(key, f"{value!r} is not one of {', '.join(allowed)}")
        return value

    def boolean(self, key: str, default: bool | None = None) -> bool:
        value = self.data.get(key, default) if default is not None else self._get(key)
        if not isinstance(value, bool):
            raise self.error(key, f"must be true or false, got {value!r}")
        return value

    def positive_int(self, key: str) -> int:
        value = self._get(key)
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise self.error(key, f"must be a positive integer, got {value!r}")
        return value

    def strings(self, key: str, required: bool = True) -> list[str]:
        value = self._get(key) if required else self.data.get(key, [])
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise self.error(key, "must be a list of strings")
        return value

    def child(self, key: str) -> _Reader:
        return _Reader(self.path, self._get(key), f"{self.prefix}{key}.")

    def items(self, key: str) -> list[_Reader]:
        value = self._get(key)
        if not isinstance(value, list) or not value:
            raise self.error(key, "must be a non-empty list")
        return [_Reader(self.path, item, f"{self.prefix}{key}[{i}].") for i, item in enumerate(value)]

"""Which target profiles the runtimes installed here can run, and what to install for the others.

A profile names, per execution provider, the runtime it needs (``edgecore.runtimes``): onnxruntime
whose build offers the provider, or OpenVINO with the device's plugin, each in a version range. The
answer is about the runtime only (``edge-agent probe`` reports the hardware beside it): a TensorRT
profile on a machine whose onnxruntime lacks the TensorRT provider is "missing" with the install
line, whatever GPU it has. What is installed is a parameter (``Installed``), so tests present a
Jetson's or a Myriad host's runtimes.

The profiles are read from this source tree's ``configs/targets``, then ``<prefix>/share/edgectl/targets``
(where the wheel and the Debian package put them), then ``$EDGE_AGENT_TARGETS_PATH``
(``os.pathsep``-separated); a later directory's profile of the same name wins.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from edgecore.errors import ConfigError
from edgecore.runtimes import ProfileNeeds, RuntimeNeed, read_profile_needs, version_matches

__all__ = ["Installed", "ProfileStatus", "installed_runtimes", "profile_dirs", "profile_needs", "profile_report",
           "profile_statuses"]

READY, PARTIAL, MISSING, UNSUPPORTED = "ready", "partial", "missing", "unsupported"


@dataclass(frozen=True)
class Installed:
    """Runtime name -> version, and what each offers: execution providers (onnxruntime) or plugins (openvino)."""

    versions: Mapping[str, str]
    offers: Mapping[str, Sequence[str]] = field(default_factory=dict)


@dataclass(frozen=True)
class ProfileStatus:
    """Whether this device's runtimes run one profile: ``ready``, ``partial`` (some accelerator providers),
    ``missing`` (none: only a CPU fallback, or nothing), ``unsupported`` (no ONNX runtime drives it)."""

    profile: str
    status: str
    problems: tuple[str, ...] = ()
    install: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form (probe --json and the birth message): problems and installs only when there are some."""
        return {"status": self.status, **({"problems": list(self.problems)} if self.problems else {}),
                **({"install": list(self.install)} if self.install else {})}


def installed_runtimes() -> Installed:
    """The runtimes of this machine, with what each offers (OpenVINO: plugins installed, with or without a device)."""
    from edgecore.backends import onnxruntime as ort_backend
    from edgecore.backends import openvino as ov_backend

    versions: dict[str, str] = {}
    offers: dict[str, list[str]] = {}
    for name, version, offered in (("onnxruntime", ort_backend.runtime_version, ort_backend.available_providers),
                                   ("openvino", ov_backend.runtime_version, ov_backend.installed_plugins)):
        try:
            versions[name], offers[name] = version(), list(offered())
        except ImportError:
            continue
    return Installed(versions, offers)


def profile_dirs() -> list[Path]:
    """Where profiles are read from, lowest priority first."""
    extra = [Path(p) for p in os.environ.get("EDGE_AGENT_TARGETS_PATH", "").split(os.pathsep) if p]
    return [Path(__file__).resolve().parents[2] / "configs" / "targets", Path(sys.prefix) / "share" / "edgectl" / "targets",
            *extra]


def profile_needs(dirs: Sequence[Path] | None = None) -> dict[str, ProfileNeeds]:
    """Every profile's needs by name (op tables, ``*-ops.yaml``, are not profiles)."""
    files: dict[str, Path] = {}
    for directory in profile_dirs() if dirs is None else dirs:
        if directory.is_dir():
            files.update({f.stem: f for f in sorted(directory.glob("*.yaml")) if not f.name.endswith("-ops.yaml")})
    return {name: read_profile_needs(path) for name, path in sorted(files.items())}


def profile_statuses(installed: Installed, profiles: Mapping[str, ProfileNeeds]) -> list[ProfileStatus]:
    """One status per profile, by name."""
    return [_status(needs, installed) for _, needs in sorted(profiles.items())]


def profile_report(installed: Installed | None = None) -> dict[str, dict[str, Any]]:
    """Profile name -> status as JSON (``edge-agent probe`` and the birth message); ConfigError for a broken profile."""
    have = installed_runtimes() if installed is None else installed
    return {status.profile: status.to_dict() for status in profile_statuses(have, profile_needs())}


def _status(profile: ProfileNeeds, installed: Installed) -> ProfileStatus:
    if profile.unsupported is not None:
        return ProfileStatus(profile.name, UNSUPPORTED, (profile.unsupported,))
    checks = [(need, _problem(need, installed)) for need in profile.needs]
    problems = tuple(f"{need.provider}: {why}" for need, why in checks if why)
    install = tuple(dict.fromkeys(need.install for need, why in checks if why))
    accelerators = [why for need, why in checks if need.accelerator]
    if not problems:
        status = READY
    elif accelerators and any(why is None for why in accelerators):
        status = PARTIAL
    else:
        status = MISSING
    return ProfileStatus(profile.name, status, problems, install)


def _problem(need: RuntimeNeed, installed: Installed) -> str | None:
    """Why the installed runtimes cannot run ``need``; None when they can."""
    version = installed.versions.get(need.runtime)
    if version is None:
        return f"{need.runtime} is not installed"
    try:
        inside = version_matches(version, need.versions)
    except ConfigError as exc:
        return str(exc)
    if not inside:
        return f"{need.runtime} {version} is outside {need.versions}"
    offered = set(installed.offers.get(need.runtime, ()))
    if need.runtime == "openvino":
        if need.device and need.device not in offered:
            return f"openvino {version} has no {need.device} plugin"
    elif need.provider not in offered:
        return f"this {need.runtime} {version} build has no {need.provider}"
    return None

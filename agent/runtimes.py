"""Versions of the inference runtimes installed on this device (birth message, selection cache)."""

from __future__ import annotations

from typing import Any

__all__ = ["runtime_versions"]


def runtime_versions() -> dict[str, Any]:
    import onnxruntime as ort

    versions: dict[str, Any] = {"onnxruntime": {"version": ort.__version__, "providers": ort.get_available_providers()}}
    try:
        import openvino as ov

        versions["openvino"] = {"version": ov.get_version(), "devices": ov.Core().available_devices}
    except ImportError:
        pass
    return versions

"""Image preprocessing declared in YAML, per model input: resize, channel order, mean/std, layout.

Example::

    inputs:
      input:                 # the model input's name
        resize: [320, 240]   # width, height (default: from the model's input shape)
        channel_order: RGB   # RGB, BGR or GRAY
        mean: [127, 127, 127]
        std: [128, 128, 128] # pixel' = (pixel - mean) / std, pixels 0..255
        layout: NCHW         # or NHWC (default: NCHW when dim 1 is 1 or 3)
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import yaml
from PIL import Image

from edgecore.errors import ConfigError, UserError

__all__ = ["ImagePreprocess", "load_preprocess"]

_KEYS = {"resize", "channel_order", "mean", "std", "layout"}


@dataclass(frozen=True)
class ImagePreprocess:
    """How to turn one image file into one input tensor."""

    input_name: str
    size: tuple[int, int] | None = None  # width, height
    channel_order: str = "RGB"
    mean: tuple[float, ...] = (0.0,)
    std: tuple[float, ...] = (1.0,)
    layout: str | None = None

    def tensor(self, path: Path, shape: list[int | None]) -> np.ndarray:
        """Read, resize, normalise and lay out `path` as a float32 batch of one."""
        layout = self.layout or ("NCHW" if len(shape) == 4 and shape[1] in (1, 3) else "NHWC")
        height, width = (shape[2], shape[3]) if layout == "NCHW" else (shape[1], shape[2])
        size = self.size or (width, height)
        if size[0] is None or size[1] is None:
            raise ConfigError(f"input '{self.input_name}' has a dynamic height/width: set resize in the YAML")
        try:
            with Image.open(path) as opened:
                img = opened.convert("L" if self.channel_order == "GRAY" else "RGB")
                resized = img.resize((int(size[0]), int(size[1])), Image.Resampling.BILINEAR)
                arr = np.asarray(resized, np.float32)
        except (OSError, ValueError, Image.DecompressionBombError) as exc:
            raise UserError(f"{path}: unreadable image ({exc})") from exc
        arr = arr[..., None] if arr.ndim == 2 else arr
        if self.channel_order == "BGR":
            arr = arr[..., ::-1]
        mean, std = np.asarray(self.mean, np.float32), np.asarray(self.std, np.float32)
        arr = (arr - mean) / std
        if layout == "NCHW":
            arr = arr.transpose(2, 0, 1)
        return np.ascontiguousarray(arr[None], dtype=np.float32)


def load_preprocess(path: Path | None, image_input: str) -> ImagePreprocess:
    """The preprocessing for `image_input` from the YAML at `path` (defaults when no file)."""
    if path is None:
        return ImagePreprocess(image_input)
    try:
        doc = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise ConfigError(f"{path}: cannot read preprocessing YAML ({exc})") from exc
    inputs = doc.get("inputs") if isinstance(doc, dict) else None
    if not isinstance(inputs, dict) or image_input not in inputs:
        raise ConfigError(f"{path}: key inputs.{image_input} missing (the model's image input)")
    spec = inputs[image_input] or {}
    unknown = set(spec) - _KEYS
    if unknown:
        raise ConfigError(f"{path}: unknown key inputs.{image_input}.{sorted(unknown)[0]} "
                          f"(known: {', '.join(sorted(_KEYS))})")
    return _parse(path, image_input, spec)


def _parse(path: Path, name: str, spec: dict[str, object]) -> ImagePreprocess:
    order = str(spec.get("channel_order", "RGB")).upper()
    layout = spec.get("layout")
    if order not in ("RGB", "BGR", "GRAY"):
        raise ConfigError(f"{path}: inputs.{name}.channel_order must be RGB, BGR or GRAY, got {order}")
    if layout is not None and str(layout).upper() not in ("NCHW", "NHWC"):
        raise ConfigError(f"{path}: inputs.{name}.layout must be NCHW or NHWC, got {layout}")
    try:
        resize = spec.get("resize")
        size = (int(resize[0]), int(resize[1])) if resize else None  # type: ignore[index]
        mean = tuple(_number(v) for v in _as_list(spec.get("mean", [0.0])))
        std = tuple(_number(v) for v in _as_list(spec.get("std", [1.0])))
    except (TypeError, ValueError, IndexError) as exc:
        raise ConfigError(f"{path}: inputs.{name}: resize is [width, height], mean/std numbers ({exc})") from exc
    return ImagePreprocess(name, size, order, mean, std, str(layout).upper() if layout else None)


def _as_list(value: object) -> list[object]:
    return list(value) if isinstance(value, (list, tuple)) else [value]


def _number(value: object) -> float:
    if not isinstance(value, (int, float, str)):
        raise TypeError(f"{value!r} is not a number")
    return float(value)

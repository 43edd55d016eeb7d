"""Fixtures for the quantize tests: tiny generated models, calibration folders, a request factory."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from tests.quantize.models import save, sensitive_mlp, tiny_cnn


@pytest.fixture()
def cnn_path(tmp_path: Path) -> Path:
    return save(tiny_cnn(), tmp_path / "cnn.onnx")


@pytest.fixture()
def mlp_path(tmp_path: Path) -> Path:
    return save(sensitive_mlp(), tmp_path / "mlp.onnx")


@pytest.fixture()
def cnn_calib(tmp_path: Path) -> Path:
    folder = tmp_path / "calib"
    folder.mkdir()
    rng = np.random.default_rng(1)
    for i in range(6):
        np.save(folder / f"{i:02d}.npy", rng.random((1, 3, 16, 16), dtype=np.float32))
    return folder


@pytest.fixture()
def vnni_cpuinfo(tmp_path: Path) -> Path:
    path = tmp_path / "cpuinfo-vnni"
    path.write_text("processor\t: 0\nflags\t\t: fpu sse2 avx2 avx512f avx512_vnni\n")
    return path


@pytest.fixture()
def plain_cpuinfo(tmp_path: Path) -> Path:
    path = tmp_path / "cpuinfo-plain"
    path.write_text("processor\t: 0\nflags\t\t: fpu sse2 avx avx2\n")
    return path

"""Golden strings from ``--golden DIR``: U arrays as they are, UTF-8 S arrays decoded, other bytes refused."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from edgecore.errors import UserError
from edgectl.package import BuildOptions, build_package
from tests.e2e.test_deploy_strings import words_model


def test_golden_bytes_that_are_not_utf8_are_refused_in_one_line(tmp_path: Path) -> None:
    samples = tmp_path / "samples"
    samples.mkdir()
    np.save(samples / "a.npy", np.array([b"cat", b"\xff\xfe"]))
    options = BuildOptions("words", 1, golden_dir=samples)
    with pytest.raises(UserError, match=r"golden input 'text' holds bytes that are not UTF-8 .*: the runtime takes strings"):
        build_package(words_model(tmp_path / "w.onnx"), options, Ed25519PrivateKey.generate(), tmp_path / "w.edgepkg")
    assert not (tmp_path / "w.edgepkg").exists()

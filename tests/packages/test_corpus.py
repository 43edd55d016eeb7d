"""`build` and `verify` over the generated corpus (tests/corpus.py): every trait real exports have packages."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from edgecore.errors import UserError
from edgecore.feeds import parse_input_shapes
from edgecore.protocol.envelope import TrustedKeys
from edgectl.keys import Keyring
from edgectl.package import BuildOptions, build_package, read_package
from tests.corpus import CORPUS, LOADABLE, write_corpus
from tests.fleet import EdgectlHome
from tests.packages.test_golden import golden_of

DYNAMIC = {"dynamic_input"}  # a dynamic dim other than the batch: refused without a shape or samples


@pytest.mark.parametrize("name", sorted(LOADABLE))
def test_every_corpus_model_packages_with_meaningful_golden_data(tmp_path: Path, offline_home: EdgectlHome, name: str) -> None:
    entry = CORPUS[name]
    model = write_corpus(tmp_path / "corpus", [name])[name]
    ring = Keyring(root=offline_home.path / "keys")
    key, trusted = ring.signing_key("package"), TrustedKeys([ring.signing_key("package").public_key()])

    plain = tmp_path / "plain.edgepkg"
    if name in DYNAMIC:
        with pytest.raises(UserError, match="--input-shape"):
            build_package(model, BuildOptions(name, 1), key, plain)
    else:
        build_package(model, BuildOptions(name, 1), key, plain)

    shaped = tmp_path / "shaped.edgepkg"
    build_package(model, BuildOptions(name, 1, input_shapes=parse_input_shapes(entry.static_shape_args())), key, shaped)
    golden = golden_of(shaped)
    assert {k: v.shape for k, v in golden.items() if k.startswith("input:")} == {f"input:{k}": v for k, v in entry.shapes.items()}

    samples = tmp_path / "samples"
    samples.mkdir()
    feeds = entry.feeds(seed=3)
    np.savez(samples / "one.npz", allow_pickle=True, **feeds)  # numpy's default, named so **feeds cannot match it
    real = tmp_path / "real.edgepkg"
    build_package(model, BuildOptions(name, 1, golden_dir=samples), key, real)
    golden = golden_of(real)
    for input_name, value in feeds.items():
        np.testing.assert_array_equal(golden[f"input:{input_name}"], value)
    assert any(k.startswith("output:") for k in golden)

    work = tmp_path / "open"
    work.mkdir()
    for package in (shaped, real):
        read_package(package, trusted, work)
        (work / "payload.tar").unlink()
    result = offline_home.edgectl("verify", str(real))
    assert result.returncode == 0, result.stderr

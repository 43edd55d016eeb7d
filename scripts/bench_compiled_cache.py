"""OpenVINO's compiled-model cache: the first load of a model (compile, write the blob) against later loads (read it).

For each model (the shared models in ../shared/models when present, else a generated classifier),
alternates rounds of: a load into an empty cache directory (a first start) and a load from the cache
that load filled (every restart after it), each through the agent's own loader
(``edgecore.backends.openvino.OvModelLoader``) on OpenVINO's CPU device; prints the medians and their
ratio. TensorRT's engine cache (the one that matters on a Jetson, where a build takes minutes) needs an
NVIDIA GPU, which this machine does not have: it is not measured here.

    ./scripts/bench compiled_cache [--rounds 5] [--write-doc]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

from benchdoc import machine, write_section

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from edgecore.backends.openvino import OvModelLoader, OvRunner, runtime_version  # noqa: E402
from edgectl.examples import tiny_classifier  # noqa: E402

SHARED = REPO.parent / "shared" / "models"
COMMAND = "./scripts/bench compiled_cache --write-doc"


def models(work: Path) -> list[Path]:
    """The shared models that OpenVINO's CPU plugin loads (ONNX-ML ones it does not), or a generated one."""
    found = sorted(p for p in SHARED.glob("*/*.onnx") if "sklearn" not in p.parts[-2]) if SHARED.is_dir() else []
    return found or [tiny_classifier(work / "classifier.onnx")]


def load_ms(model: Path, cache: Path) -> tuple[str, float]:
    with OvRunner(OvModelLoader(model, "CPU", cache_dir=cache)) as runner:
        load = runner.placement.load or {}
    return str(load.get("cache")), float(load.get("load_ms", 0.0))


def measure(model: Path, rounds: int) -> tuple[float, float] | str:
    """(median first load, median cached load) in ms, or why the model could not be measured."""
    first, cached = [], []
    try:
        for _ in range(rounds):
            with tempfile.TemporaryDirectory() as tmp:
                state, ms = load_ms(model, Path(tmp))
                assert state == "miss", state
                first.append(ms)
                state, ms = load_ms(model, Path(tmp))
                assert state == "hit", state
                cached.append(ms)
    except Exception as exc:  # a model OpenVINO's CPU plugin cannot compile is reported, not fatal
        return f"not measured: {str(exc).splitlines()[0][:120]}"
    return statistics.median(first), statistics.median(cached)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--write-doc", action="store_true", help="write the table into docs/benchmarks.md")
    args = parser.parse_args()
    rows = ["| model | size | first load (compile) ms | cached load ms | first / cached |", "|---|---:|---:|---:|---:|"]
    with tempfile.TemporaryDirectory() as work:
        for model in models(Path(work)):
            result = measure(model, args.rounds)
            size, name = f"{model.stat().st_size / 2**20:.1f} MB", f"{model.parent.name}/{model.name}"
            if isinstance(result, str):
                rows.append(f"| {name} | {size} | {result} | | |")
            else:
                rows.append(f"| {name} | {size} | {result[0]:.1f} | {result[1]:.1f} | {result[0] / result[1]:.2f}x |")
            print(rows[-1], flush=True)
    body = (f"OpenVINO {runtime_version()} CPU plugin, {args.rounds} rounds (median), on {machine()}. A first load reads"
            f" the ONNX model, compiles it and writes the blob to the model's key under `<state>/compiled`; a cached"
            f" load reads the blob. TensorRT (engine and timing caches): not measured, no NVIDIA GPU on this machine.\n\n"
            + "\n".join(rows))
    if args.write_doc:
        print(write_section("Devices: compiled-model cache", COMMAND, body))
    return 0


if __name__ == "__main__":
    sys.exit(main())

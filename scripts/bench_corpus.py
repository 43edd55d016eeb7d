"""Backend pick stability on every corpus model (``./scripts/bench corpus``).

For each model of the generated corpus (``tests/corpus.py``) and each ``*/*.onnx`` under
``../shared/models`` when present:

1. five probes: ``select_backend`` afresh each time (what ``edge-agent probe --model`` runs), with
   the decision each made (the rule, the ratio against the runner-up) and the 1-minute load
   average around it (the higher of its start and end);
2. every candidate that passed timed *independently*: alone (its session the only one open), one
   after the other, in passes of alternating order (``--passes``, 4 by default); the fastest (lowest geometric mean of its
   pass medians) is the reference, and the slowest pick's ratio to it comes with a 95% interval
   from the paired pass medians;
3. the goals, per probe: at a load average <= 3, at least 95% of the picks within 5% of that
   fastest; at a load average <= 10, no pick worse than 1.2x. Per model, a pick more than 5% slower
   by the point estimate whose independent interval still reaches 1.05 is reported as
   *unresolved*: on this machine the reference timing itself cannot tell.
4. NNAPI partitions as ``targets.analyse`` reports them (the runtime view) beside onnxruntime's own
   mobile usability checker, run on the model as that checker runs it;
5. ``edgectl quantize --mode auto`` for each of ``--targets`` (``scripts/corpus_quantize.py``): outcome,
   chosen format, accuracy per output against the budget, latency quantized / float on this host.

Steps 1-4 go to the ``backend pick stability`` sections of docs/benchmarks.md, step 5 to the
``quantize per target`` ones; ``--no-probe`` or ``--no-quantize`` runs (and records) one part only.
"""

from __future__ import annotations

import argparse
import collections
import os
import shlex
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import onnx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

from benchdoc import machine, write_section  # noqa: E402
from corpus_quantize import DEFAULT_TARGETS, Quantized, QuantSettings, quantize_model, warm_up  # noqa: E402
from corpus_quantize import describe as describe_quantized  # noqa: E402
from corpus_quantize import markdown as markdown_quantized  # noqa: E402

from agent.catalog import Candidate  # noqa: E402
from agent.hardware import Hardware, probe_hardware  # noqa: E402
from agent.selection import Selection, Status, select_backend  # noqa: E402
from agent.timing import Interval, ratio_interval  # noqa: E402
from edgecore.errors import EdgeError, one_line  # noqa: E402
from tests.corpus import CORPUS, write_corpus  # noqa: E402

MODELS = ROOT.parent / "shared" / "models"
Feeds = Callable[[int], dict[str, np.ndarray]]  # seed -> one sample


def _audio(samples: int, seed: int, **state: tuple[int, ...]) -> dict[str, np.ndarray]:
    """A voice-activity model's inputs: one chunk of audio, zero recurrent state."""
    feeds = {"input": np.random.default_rng(seed).uniform(-0.5, 0.5, (1, samples)).astype(np.float32)}
    return feeds | {name: np.zeros(shape, np.float32) for name, shape in state.items()}


def _around(folder: str, key: str, name: str) -> Feeds:
    """Samples around a model's reference input (its reference_io_ort.npz): seed 0 as is, others shifted and scaled."""
    def feeds(seed: int) -> dict[str, np.ndarray]:
        with np.load(MODELS / folder / "reference_io_ort.npz") as saved:
            image = saved[key].astype(np.float32)
        return {name: np.roll(image, seed, axis=-1) * (1.0 - 0.03 * (seed % 5))}
    return feeds


def _rows(folder: str, key: str, name: str) -> Feeds:
    """One row of a model's reference inputs (its reference_io_ort.npz), a different one per seed."""
    def feeds(seed: int) -> dict[str, np.ndarray]:
        with np.load(MODELS / folder / "reference_io_ort.npz") as saved:
            rows = saved[key]
        return {name: rows[seed % len(rows)][None]}
    return feeds


def _pixels(seed: int) -> dict[str, np.ndarray]:
    """road-segmentation-adas: random BGR pixels 0..255 in NHWC, as its reference input is."""
    return {"data": np.random.default_rng(seed).uniform(0, 255, (1, 512, 896, 3)).astype(np.float32)}


# Inputs for shared models that generated ones cannot serve (a sequence length, a sample rate of 16000) or where
# the model's own reference input means more (a photo, pixels in 0..255): probe goldens (seed 0) and calibration.
SHARED_FEEDS: dict[str, Feeds] = {
    "silero_vad.onnx": lambda seed: _audio(576, seed, state=(2, 1, 128)) | {"sr": np.array(16000, np.int64)},
    "silero_vad_16k_op15.onnx": lambda seed: _audio(576, seed, state=(2, 1, 128)) | {"sr": np.array(16000, np.int64)},
    "silero_vad_v3.1_2021_with_attention.onnx": lambda seed: _audio(1536, seed, h0=(2, 1, 64), c0=(2, 1, 64)),
    "ultraface_RFB-320.onnx": _around("ultraface-rfb320", "input", "input"),  # the upstream photo, preprocessed
    "mnist-8.onnx": _around("mnist8-modelzoo", "input", "Input3"),
    "road_segmentation_adas_0001.onnx": _pixels,
    "magika-standard_v3_3/model.onnx": _rows("magika-standard_v3_3", "bytes", "bytes"),  # real files' bytes
}
GOAL = 1.05
QUIET_LOAD, QUIET_SHARE = 3.0, 0.95  # at a load average <= 3, at least 95% of picks within GOAL
BUSY_LOAD, BUSY_WORST = 10.0, 1.2  # at a load average <= 10, no pick worse than 1.2x
SETS = {"corpus": "generated corpus", "shared": "shared models", "all": "corpus and shared models"}
SECTIONS = {key: f"backend pick stability ({text})" for key, text in SETS.items()}
QUANTIZE_SECTIONS = {key: f"quantize per target ({text})" for key, text in SETS.items()}


@dataclass(frozen=True)
class Subject:
    """A model to measure: its inputs (None: generated from its signature) and the shapes to quantize it at."""

    name: str
    source: str
    path: Path
    feeds: Feeds | None = None
    static_shape: tuple[str, ...] = ()


@dataclass
class Row:
    """One model's figures."""

    name: str
    source: str
    picks: list[str] = field(default_factory=list)
    decisions: list[dict[str, Any]] = field(default_factory=list)
    loads: list[float] = field(default_factory=list)  # 1-minute load average around each probe
    passes_ms: dict[str, list[float]] = field(default_factory=dict)
    nnapi: str = "-"
    note: str = ""

    @property
    def independent_ms(self) -> dict[str, float]:
        """Geometric mean of each candidate's pass medians."""
        return {name: float(np.exp(np.mean(np.log(ms)))) for name, ms in self.passes_ms.items()}

    @property
    def fastest(self) -> str | None:
        ms = self.independent_ms
        return min(ms, key=ms.__getitem__) if ms else None

    @property
    def worst(self) -> Interval | None:
        """The slowest pick over the fastest, with its 95% interval from the paired passes."""
        fastest = self.fastest
        if not self.picks or fastest is None:
            return None
        ms = self.independent_ms
        pick = max(set(self.picks), key=ms.__getitem__)
        return ratio_interval(self.passes_ms[pick], self.passes_ms[fastest], confidence=0.95)

    def probe_ratios(self) -> list[tuple[float, float, bool]]:
        """(load average, the pick's independent median over the fastest's, whether the independent timing's own
        95% interval of that ratio lies above 1.05) per probe."""
        ms, fastest = self.independent_ms, self.fastest
        if fastest is None:
            return []

        def resolved(pick: str) -> bool:
            return pick != fastest and ratio_interval(self.passes_ms[pick], self.passes_ms[fastest], 0.95).low > GOAL

        return [(load, ms[pick] / ms[fastest], resolved(pick)) for load, pick in zip(self.loads, self.picks, strict=True)]

    @property
    def verdict(self) -> str | None:
        """held, missed, unresolved (the reference timing cannot tell), or None when not measured."""
        worst = self.worst
        if worst is None:
            return None
        if worst.ratio <= GOAL:
            return "held"
        return "unresolved" if worst.low <= GOAL else "missed"


def models(which: str, only: list[str], workdir: Path) -> list[Subject]:
    """The corpus and/or the shared models, with their inputs where generated ones cannot serve."""
    found: list[Subject] = []
    if which in ("corpus", "all"):
        found += [Subject(name, "corpus", path, CORPUS[name].feeds, tuple(CORPUS[name].static_shape_args()))
                  for name, path in write_corpus(workdir).items()]
    if which in ("shared", "all") and MODELS.is_dir():
        found += [Subject(f"{p.parent.name}/{p.name}", "shared", p,
                          SHARED_FEEDS.get(f"{p.parent.name}/{p.name}") or SHARED_FEEDS.get(p.name))
                  for p in sorted(MODELS.glob("*/*.onnx"))]
    return [m for m in found if not only or any(o in m.name for o in only)]


def probe(path: Path, hardware: Hardware, feeds: dict[str, np.ndarray] | None, budget_s: float) -> Selection:
    with tempfile.TemporaryDirectory() as cache:  # like edge-agent probe: a throw-away cache, measured afresh
        return select_backend(path, hardware=hardware, allowed_providers=None, golden=feeds, expected=None,
                              cache_dir=Path(cache), time_budget_s=budget_s, remeasure=True)


def independent(path: Path, candidates: list[Candidate], feeds: dict[str, np.ndarray], seconds: float,
                passes: int = 4) -> dict[str, list[float]]:
    """Each candidate alone, ``seconds`` in all (at least 3 runs a pass), in passes of alternating order: median ms per pass."""
    medians: dict[str, list[float]] = collections.defaultdict(list)
    for k in range(passes):
        for cand in candidates if k % 2 == 0 else candidates[::-1]:
            with cand.open(path) as runner:
                for _ in range(3):
                    runner.infer(feeds, check=False)
                times: list[float] = []
                end = time.perf_counter() + seconds / passes
                while len(times) < 3 or time.perf_counter() < end:
                    start = time.perf_counter()
                    runner.infer(feeds, check=False)
                    times.append(time.perf_counter() - start)
            medians[cand.name].append(float(np.median(times)) * 1000)
    return dict(medians)


def nnapi_partitions(path: Path) -> str:
    """``ours / onnxruntime checker`` NNAPI partitions, or why one side could not tell."""
    from onnxruntime.tools.mobile_helpers import usability_checker
    from onnxruntime.tools.onnx_model_utils import ModelProtoWithShapeInfo, optimize_model

    import targets

    model = onnx.load(str(path))
    try:
        ours = str(targets.analyse(model, targets.load_profile("nnapi")).runtime.accelerator_partitions)
    except Exception as exc:  # a figure for a table: say why, keep going
        ours = f"error ({one_line(exc)[:60]})"
    with tempfile.TemporaryDirectory() as tmp:
        source, optimized = Path(tmp) / "model.onnx", Path(tmp) / "optimized.onnx"
        onnx.save(model, str(source))
        try:
            optimize_model(source, optimized, use_external_initializers=True)
            with_shapes = ModelProtoWithShapeInfo(optimized).model_with_shape_info
            theirs = str(usability_checker.check_nnapi_partitions(with_shapes, True).num_partitions)
        except Exception as exc:  # the checker cannot analyse some models (shape inference fails)
            theirs = f"n/a ({one_line(exc)[:60]})"
    return f"{ours} / {theirs}"


def measure(subject: Subject, hardware: Hardware, args: argparse.Namespace) -> Row:
    row, path = Row(subject.name, subject.source), subject.path
    feeds = subject.feeds(0) if subject.feeds else None
    row.nnapi = nnapi_partitions(path) if args.nnapi else "-"
    selections = []
    try:
        for _ in range(args.probes):
            before = os.getloadavg()[0]
            selections.append(probe(path, hardware, feeds, args.budget))
            row.loads.append(max(before, os.getloadavg()[0]))
    except EdgeError as exc:
        row.note = f"not probed: {one_line(exc)[:120]}"
        return row
    row.picks = [s.backend for s in selections]
    row.decisions = [s.decision.to_dict() if s.decision else {} for s in selections]
    passing = [f.candidate for f in selections[0].figures if f.status is Status.OK]
    if feeds is None:
        from edgecore.tensors import synthetic_feeds

        with passing[0].open(path) as runner:
            feeds = synthetic_feeds(runner.inputs)
    row.passes_ms = independent(path, passing, feeds, args.independent, args.passes)
    return row


def short(backend: str) -> str:
    return backend.replace("ExecutionProvider", "")


def describe(row: Row) -> list[str]:
    if row.note:
        return [row.name, row.source, row.note, "-", "-", "-", "-", "-", row.nnapi]
    picks = ", ".join(f"{short(b)} x{n}" for b, n in collections.Counter(row.picks).most_common())
    rules = ", ".join(f"{r} x{n}" for r, n in collections.Counter(d.get("rule", "?") for d in row.decisions).most_common())
    ratios = [d["ratio"] for d in row.decisions if d.get("ratio") is not None]
    decided = rules + (f"; ratio {min(ratios):.2f}-{max(ratios):.2f}" if ratios else "")
    independent = ", ".join(f"{short(b)} {ms:.3f}" for b, ms in sorted(row.independent_ms.items()))
    worst = row.worst
    verdict = "-" if worst is None else f"{worst.ratio:.3f} [{worst.low:.2f}, {worst.high:.2f}] {row.verdict}"
    loads = f"{min(row.loads):.1f}-{max(row.loads):.1f}" if row.loads else "-"
    return [row.name, row.source, picks, decided, loads, independent, short(row.fastest or "-"), verdict, row.nnapi]


HEADER = ["model", "from", "picks (probes)", "decisions (rule x probes; ratio to runner-up)", "load avg",
          "independent median ms", "fastest", "slowest pick / fastest [95%]: goal", "NNAPI partitions (ours / ORT checker)"]


def goals(rows: list[Row]) -> str:
    """The per-probe goals, judged by load average: quiet (<= 3) and busy (<= 10)."""
    ratios = [r for row in rows for r in row.probe_ratios()]
    if not ratios:
        return "**No probe measured.**"
    loads = [load for load, _, _ in ratios]
    quiet = [q for load, q, _ in ratios if load <= QUIET_LOAD]
    busy = [q for load, q, _ in ratios if load <= BUSY_LOAD]
    held = sum(q <= GOAL for q in quiet)
    if quiet:
        share = held / len(quiet)
        first = (f"at load <= {QUIET_LOAD:g}: {held} of {len(quiet)} probes within 5% of the fastest ({share:.0%}; "
                 f"goal {QUIET_SHARE:.0%}): {'PASS' if share >= QUIET_SHARE else 'FAIL'}")
    else:
        first = f"at load <= {QUIET_LOAD:g}: no probe (the load average never fell to {QUIET_LOAD:g}): not measured"
    if busy:
        second = (f"at load <= {BUSY_LOAD:g}: worst pick {max(busy):.3f}x the fastest over {len(busy)} probes "
                  f"(goal <= {BUSY_WORST:g}): {'PASS' if max(busy) <= BUSY_WORST else 'FAIL'}")
    else:
        second = f"at load <= {BUSY_LOAD:g}: no probe: not measured"
    loud = [q for load, q, _ in ratios if load > BUSY_LOAD]
    third = (f"; above {BUSY_LOAD:g}: {len(loud)} probes, {sum(q <= GOAL for q in loud)} within 5%, worst "
             f"{max(loud):.3f}x" if loud else "")
    every = sum(q <= GOAL for _, q, _ in ratios)
    sure = sum(q > GOAL and resolved for _, q, resolved in ratios)
    return (f"**Goals, per probe: {first}; {second}**{third}. Over all {len(ratios)} probes {every} were within 5% of "
            f"the fastest by the estimate, and {sure} of the others were more than 5% slower by the independent "
            f"timing's own 95% interval too; the load average (1 minute, {os.cpu_count()} cores) ran {min(loads):.1f} "
            f"to {max(loads):.1f}.")


def markdown(rows: list[Row], args: argparse.Namespace) -> str:
    lines = ["| " + " | ".join(HEADER) + " |", "|" + "---|" * len(HEADER)]
    lines += ["| " + " | ".join(describe(r)) + " |" for r in rows]
    verdicts = collections.Counter(r.verdict for r in rows if r.verdict is not None)
    judged = sum(verdicts.values())
    return (f"Machine: {machine()}.\n\nEach model probed {args.probes} times with `select_backend` afresh (time budget "
            f"{args.budget:g} s per probe, as `edge-agent probe --model M --budget {args.budget:g}`), the 1-minute load "
            f"average noted around each; every candidate that passed then timed alone, {args.independent:g} s each in "
            f"{args.passes} passes of alternating order. {goals(rows)}\n\nPer model, every pick within 5% of the independently "
            f"fastest: held on {verdicts['held']} of {judged} models, missed on {verdicts['missed']}, unresolved on "
            f"{verdicts['unresolved']} (unresolved: a pick more than 5% slower by the estimate, but the independent "
            f"timing's own 95% interval reaches 1.05). Rules (`agent/timing.py`): `faster` when the 99% interval of the "
            f"ratio left the noise, `estimate` when the budget ran out before it could tell (the faster by the point "
            f"estimate), `p95`/`memory`/`order` only for a true tie (the interval within 1 +- 5%), `only` for a single "
            f"candidate.\n\n" + "\n".join(lines))


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--probes", type=int, default=5, help="probes per model (default 5)")
    parser.add_argument("--budget", type=float, default=10.0,
                        help="time budget of each probe in seconds (default 10, the agent's selection_budget_s)")
    parser.add_argument("--independent", type=float, default=4.0,
                        help="seconds of independent timing per candidate, split over the passes (default 4)")
    parser.add_argument("--passes", type=int, default=4,
                        help="passes of independent timing, in alternating order (default 4)")
    parser.add_argument("--only", action="append", default=[], help="only models whose name contains this (repeat)")
    parser.add_argument("--set", choices=list(SECTIONS), default="all",
                        help="the generated corpus, the models in ../shared/models, or both (default); each its own section")
    parser.add_argument("--no-nnapi", dest="nnapi", action="store_false", help="skip the NNAPI partition column")
    parser.add_argument("--no-probe", dest="probe", action="store_false",
                        help="skip the backend pick part (probes, independent timing, NNAPI partitions)")
    parser.add_argument("--no-quantize", dest="quantize", action="store_false", help="skip the quantize part")
    parser.add_argument("--targets", default=",".join(DEFAULT_TARGETS),
                        help=f"comma-separated target profiles to quantize for, or 'all' (default {','.join(DEFAULT_TARGETS)})")
    parser.add_argument("--calib", type=int, default=8, help="calibration samples per model (default 8)")
    parser.add_argument("--max-drop", type=float, default=1.0, help="quantize accuracy budget in points (default 1)")
    parser.add_argument("--no-measure", dest="measure", action="store_false",
                        help="quantize without its latency measurement (as edgectl quantize --no-measure)")
    parser.add_argument("--measure-max-ms", type=float, default=100.0,
                        help="quantize without latency measurement models whose float inference takes longer (default 100)")
    parser.add_argument("--quantize-max-ms", type=float, default=150.0,
                        help="skip quantizing models whose float inference takes longer: their calibration needs "
                             "more memory and time than a benchmark run on a small host has (default 150)")
    parser.add_argument("--no-docs", action="store_true", help="do not write the figures into docs/benchmarks.md")
    args = parser.parse_args()
    if not args.probe and not args.quantize:
        parser.error("--no-probe and --no-quantize leave nothing to measure")
    args.targets = _targets(parser, args.targets)
    return args


def _targets(parser: argparse.ArgumentParser, value: str) -> tuple[str, ...]:
    import targets

    known = [p.name for p in targets.list_profiles()]
    names = known if value == "all" else [t.strip() for t in value.split(",") if t.strip()]
    unknown = [t for t in names if t not in known]
    if unknown or not names:
        parser.error(f"--targets {value!r}: unknown {', '.join(unknown) or 'none given'} (known: {', '.join(known)})")
    return tuple(names)


def main() -> None:
    args = parse_args()
    command = ("./scripts/bench corpus " + shlex.join(sys.argv[1:])).strip()
    settings = QuantSettings(args.targets, args.calib, args.max_drop, args.measure, args.measure_max_ms,
                             args.quantize_max_ms)
    hardware = probe_hardware() if args.probe else None
    if args.quantize:
        warm_up()
    started = time.perf_counter()
    rows: list[Row] = []
    quantized: list[Quantized] = []
    with tempfile.TemporaryDirectory() as tmp:
        for subject in models(args.set, args.only, Path(tmp)):
            if hardware is not None:
                rows.append(measure(subject, hardware, args))
                print(" | ".join(describe(rows[-1])), flush=True)
            if args.quantize:
                done = quantize_model(subject.name, subject.path, subject.feeds, subject.static_shape, Path(tmp), settings)
                quantized += done
                for result in done:
                    print(" | ".join(describe_quantized(result)), flush=True)
    took = (f"\n\nThe run took {time.perf_counter() - started:.0f} s{' (both parts)' if args.probe and args.quantize else ''}"
            f", load average {_load()} at its end.")
    parts = ([(SECTIONS[args.set], markdown(rows, args))] if args.probe else []) + (
        [(QUANTIZE_SECTIONS[args.set], f"Machine: {machine()}.\n\n" + markdown_quantized(quantized, settings))]
        if args.quantize else [])
    for section, body in parts:
        print(f"\n## {section}\n\n{body}{took}")
    print(f"\nmeasured: {'backend picks' if args.probe else ''}{' and ' if args.probe and args.quantize else ''}"
          f"{'quantize for ' + ', '.join(args.targets) if args.quantize else ''}"
          f"{' (no latency)' if args.quantize and not args.measure else ''}\nrerun: {command}")
    if not args.no_docs:
        for section, body in parts:
            print(f"figures written to {write_section(section, command, body + took).relative_to(ROOT)} (## {section})")


def _load() -> str:
    return " / ".join(f"{x:.1f}" for x in os.getloadavg()) + f" (1/5/15 min, {os.cpu_count()} cores)"


if __name__ == "__main__":
    main()

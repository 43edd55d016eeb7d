"""``./scripts/mutants``: plant bugs in the guard modules and check that their tests catch each one.

For every module listed in ``scripts/mutation_targets.toml`` (a module, the tests that cover it,
and optionally the functions to mutate), :func:`mutation.plant` makes its mutants; each runs
only that module's tests, in a private copy of the repository (``/tmp``: a crash never leaves a
mutated file in the checkout), on ``--jobs`` workers (``scripts/mutation_worker.py``), with a
timeout of a few times the module's unmutated test time. The report gives the score per module
and every survivor as ``file:line`` and the mutation. A survivor that is an equivalent mutant
(no test could tell it apart) is listed, with the reason, in ``scripts/mutation_allow.toml``.
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import tomllib
from mutation import Mutant, plant

REPO = Path(__file__).resolve().parents[1]
HERE = Path(__file__).resolve().parent
KILLED = ("killed", "timeout")
# Property tests run this many examples per mutant (a fixed seed, so every run plants and judges alike); the
# suite runs more. EDGE_FUZZ_EXAMPLES set by the caller wins.
FUZZ_EXAMPLES = "25"
IGNORED = (".git", ".venv", "__pycache__", "*.egg-info", ".mypy_cache", ".ruff_cache", ".pytest_cache", ".hypothesis",
           ".mutation-child.log")


@dataclass(frozen=True)
class Target:
    path: str
    tests: tuple[str, ...]
    scope: tuple[str, ...] = ()


@dataclass(frozen=True)
class Allowed:
    path: str
    where: str
    mutation: str
    reason: str
    line: int | None = None  # only where one function holds the same mutation twice and only one is equivalent

    def matches(self, mutant: Mutant) -> bool:
        return (self.path, self.where, self.mutation) == (mutant.path, mutant.where, mutant.describe()) and \
            self.line in (None, mutant.line)


@dataclass
class Result:
    mutant: Mutant
    outcome: str  # killed | timeout | survived | error
    seconds: float
    allowed: Allowed | None = None


@dataclass
class ModuleRun:
    target: Target
    source: str  # the module as it was before any mutant
    mutants: list[Mutant]
    planted: int  # before sampling
    timeout: float = 0.0
    baseline: str = ""  # why the unmutated tests did not pass, when they did not
    flaky: bool = False  # the unmutated tests failed once and passed when run again (the report says so)
    results: list[Result] = field(default_factory=list)
    allowed: list[Allowed] = field(default_factory=list)  # the explanations for this module's mutants


def load_targets(path: Path) -> list[Target]:
    data = tomllib.loads(path.read_text())
    return [Target(t["path"], tuple(t["tests"]), tuple(t.get("scope", ()))) for t in data.get("target", [])]


def load_allowed(path: Path) -> list[Allowed]:
    if not path.is_file():
        return []
    data = tomllib.loads(path.read_text())
    return [Allowed(a["path"], a["where"], a["mutation"], a["reason"], a.get("line")) for a in data.get("equivalent", [])]


# -- the copies the workers mutate ---------------------------------------------------------------------


def copy_tree(root: Path, dest: Path, head: bool) -> None:
    """The checkout as it is (or its last commit, ``head``) in ``dest``, compiled to hash-checked .pyc files."""
    if head:
        dest.mkdir(parents=True)
        archive = subprocess.run(["git", "-C", str(root), "archive", "HEAD"], check=True, capture_output=True).stdout
        subprocess.run(["tar", "-x", "-C", str(dest)], input=archive, check=True)
    else:
        shutil.copytree(root, dest, ignore=shutil.ignore_patterns(*IGNORED), symlinks=True)
    subprocess.run([sys.executable, "-m", "compileall", "-q", "-j", "0", "--invalidation-mode", "checked-hash", str(dest)],
                   check=True, stdout=subprocess.DEVNULL)


class Worker:
    """A ``mutation_worker.py`` process in its own copy of the tree."""

    def __init__(self, tree: Path) -> None:
        env = {**os.environ, "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "PYTHONHASHSEED": "0",
               "PYTHONPATH": str(tree), "EDGE_FUZZ_EXAMPLES": os.environ.get("EDGE_FUZZ_EXAMPLES", FUZZ_EXAMPLES)}
        self.process = subprocess.Popen([sys.executable, str(HERE / "mutation_worker.py")], cwd=tree, text=True,
                                        stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env)
        ready = self._read()
        assert ready.get("ready"), ready

    def _read(self) -> dict[str, Any]:
        assert self.process.stdout is not None
        line = self.process.stdout.readline()
        if not line:
            raise RuntimeError("a mutation worker ended unexpectedly")
        answer: dict[str, Any] = json.loads(line)
        return answer

    def run(self, path: str, source: str | None, tests: Sequence[str], timeout: float) -> dict[str, Any]:
        assert self.process.stdin is not None
        self.process.stdin.write(json.dumps({"path": path, "source": source, "tests": list(tests), "timeout": timeout}) + "\n")
        self.process.stdin.flush()
        return self._read()

    def close(self) -> None:
        if self.process.stdin is not None:
            self.process.stdin.close()
        self.process.wait(30)

    def stop(self) -> None:
        """Interrupted: the worker ends its running mutant's tests (their whole process group) and exits."""
        self.process.terminate()
        self.process.wait(30)


# -- running ----------------------------------------------------------------------------------------------


def _pool(workers: list[Worker], jobs: list[Any], work: Any) -> None:
    """Run ``work(worker, job)`` for every job, one thread per worker pulling from one queue."""
    pending: queue.Queue[Any] = queue.Queue()
    for job in jobs:
        pending.put(job)

    def drain(worker: Worker) -> None:
        while True:
            try:
                job = pending.get_nowait()
            except queue.Empty:
                return
            work(worker, job)

    threads = [threading.Thread(target=drain, args=(w,), daemon=True) for w in workers]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()


def baselines(workers: list[Worker], runs: list[ModuleRun], timeout: float | None, out: IO[str]) -> None:
    """Each module's tests on the unmutated tree: they must pass; their time sets the mutants' timeout."""

    def work(worker: Worker, run: ModuleRun) -> None:
        answer = worker.run(run.target.path, None, run.target.tests, 900)
        print(f"baseline {run.target.path}: {answer['seconds']:.1f}s, {answer['outcome']}", file=out, flush=True)
        if answer["outcome"] != "passed":  # why, in full: the report's table has room for its first line only
            print("\n".join(f"  | {line}" for line in answer["tail"].splitlines()), file=out, flush=True)
            again = worker.run(run.target.path, None, run.target.tests, 900)  # once more: a flaky test, or broken?
            print(f"baseline {run.target.path}, again: {again['seconds']:.1f}s, {again['outcome']}", file=out, flush=True)
            if again["outcome"] == "passed":
                run.flaky = True  # its mutants run; the report marks the module, whose kills a flaky test may inflate
            else:
                run.baseline = f"unmutated tests {answer['outcome']} (exit {answer['rc']}): {answer['tail'][-600:]}"
        run.timeout = timeout or max(20.0, 3 * answer["seconds"] + 10)

    _pool(workers, runs, work)


def mutate(workers: list[Worker], runs: list[ModuleRun], allowed: list[Allowed], out: IO[str]) -> None:
    jobs = [(run, m) for run in runs if not run.baseline for m in run.mutants]
    total, done, lock = len(jobs), [0], threading.Lock()
    started = time.monotonic()

    def work(worker: Worker, job: tuple[ModuleRun, Mutant]) -> None:
        run, mutant = job
        answer = worker.run(mutant.path, mutant.apply(run.source), run.target.tests, run.timeout)
        outcome = {"passed": "survived", "failed": "killed", "timeout": "timeout"}[answer["outcome"]]
        if answer["rc"] in (4, 5):  # pytest's usage error or no tests: the run says nothing about the mutant ...
            # ... unless a conftest no longer imports: the same tests loaded it unmutated (the baseline), so the mutant
            # broke importing the project itself (e.g. a module-level declaration now raises), and the suite fails
            outcome = "killed" if answer.get("conftest_broken") else "error"
        result = Result(mutant, outcome, answer["seconds"], next((a for a in allowed if a.matches(mutant)), None))
        with lock:
            run.results.append(result)
            done[0] += 1
            if outcome == "survived" and result.allowed is None:
                print(f"  survived {mutant.path}:{mutant.line} [{mutant.where}] {mutant.operator}: {mutant.describe()}",
                      file=out, flush=True)
            if done[0] % 25 == 0 or done[0] == total:
                rate = (time.monotonic() - started) / done[0]
                print(f"[{done[0]}/{total}] about {rate * (total - done[0]) / 60:.0f} min left", file=out, flush=True)

    _pool(workers, jobs, work)


# -- the report -------------------------------------------------------------------------------------------


def score(results: Sequence[Result]) -> tuple[int, int, int, int]:
    """(killed, survived and unexplained, equivalent, errors) of a set of results."""
    killed = sum(r.outcome in KILLED for r in results)
    equivalent = sum(r.outcome == "survived" and r.allowed is not None for r in results)
    survived = sum(r.outcome == "survived" and r.allowed is None for r in results)
    return killed, survived, equivalent, sum(r.outcome == "error" for r in results)


def _percent(killed: int, counted: int) -> str:
    return f"{100 * killed / counted:.1f}%" if counted else "n/a"


def report(runs: list[ModuleRun], out: IO[str]) -> float | None:
    """Print the table and the survivors; return the overall score (killed / mutants less equivalents)."""
    print("\n| module | mutants | killed | survived | equivalent | score |", file=out)
    print("|---|---:|---:|---:|---:|---:|", file=out)
    everything: list[Result] = []
    for run in runs:
        sampled = f"{len(run.mutants)} of {run.planted}" if len(run.mutants) < run.planted else str(run.planted)
        if run.baseline:
            print(f"| {run.target.path} | {sampled} | - | - | - | not run: {run.baseline.splitlines()[0]} |", file=out)
            continue
        killed, survived, equivalent, errors = score(run.results)
        everything += run.results
        note = (f" ({errors} errors)" if errors else "") + (" (baseline flaky: failed once, passed again)" if run.flaky else "")
        print(f"| {run.target.path} | {sampled} | {killed} | {survived} | {equivalent} | "
              f"{_percent(killed, len(run.results) - equivalent)}{note} |", file=out)
    killed, survived, equivalent, errors = score(everything)
    print(f"| **all** | {len(everything)} | {killed} | {survived} | {equivalent} | "
          f"**{_percent(killed, len(everything) - equivalent)}** |", file=out)
    survivors = sorted((r for r in everything if r.outcome == "survived" and r.allowed is None),
                       key=lambda r: (r.mutant.path, r.mutant.line))
    if survivors:
        print(f"\n{len(survivors)} survivor(s) (no test failed; kill each with a test, or explain it in "
              "scripts/mutation_allow.toml):", file=out)
        for r in survivors:
            print(f"  {r.mutant.path}:{r.mutant.line} [{r.mutant.where}] {r.mutant.operator}: {r.mutant.describe()}", file=out)
    for run in runs:
        for r in run.results:
            if r.outcome == "error":
                print(f"  error {r.mutant.path}:{r.mutant.line}: the tests could not run", file=out)
    _check_allowed(runs, out)
    counted = len(everything) - equivalent
    return 100 * killed / counted if counted else None


def _check_allowed(runs: list[ModuleRun], out: IO[str]) -> None:
    """An explanation that matches a killed mutant is wrong; one that matches nothing planted is stale."""
    allowed = {id(r.allowed): r.allowed for run in runs for r in run.results if r.allowed is not None}
    for run in runs:
        for r in run.results:
            if r.allowed is not None and r.outcome != "survived":
                print(f"  explained as equivalent but {r.outcome}: {r.mutant.path}:{r.mutant.line} [{r.mutant.where}] "
                      f"{r.mutant.describe()} (remove it from scripts/mutation_allow.toml)", file=out)
    for entry in [a for run in runs for a in run.allowed if id(a) not in allowed]:
        print(f"  stale explanation (no such mutant now): {entry.path} [{entry.where}] {entry.mutation}", file=out)


def list_mutants(runs: list[ModuleRun], allowed: list[Allowed], out: IO[str]) -> None:
    for run in runs:
        print(f"{run.target.path}: {len(run.mutants)} mutant(s); tests: {' '.join(run.target.tests)}", file=out)
        for m in run.mutants:
            mark = "  (equivalent)" if any(a.matches(m) for a in allowed) else ""
            print(f"  {m.path}:{m.line} [{m.where}] {m.operator}: {m.describe()}{mark}", file=out)
    print(f"{sum(len(r.mutants) for r in runs)} mutant(s) in {len(runs)} module(s)", file=out)


# -- the command ------------------------------------------------------------------------------------------


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="./scripts/mutants", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--module", action="append", default=[], metavar="PATH",
                        help="only modules whose path contains PATH (repeatable), e.g. --module envelope")
    parser.add_argument("--list", action="store_true", help="list the mutants and the tests each module runs; run nothing")
    parser.add_argument("--jobs", type=int, default=2, help="workers running mutants side by side (default 2)")
    parser.add_argument("--sample", type=int, default=0, metavar="N",
                        help="at most N mutants per module, drawn at random with a fixed seed (the report says so)")
    parser.add_argument("--timeout", type=float, default=None, metavar="S",
                        help="seconds per mutant (default: 3x the module's unmutated test time + 10 s, at least 20 s)")
    parser.add_argument("--head", action="store_true", help="mutate the last commit, not the working tree")
    parser.add_argument("--fail-under", type=float, default=95.0, metavar="PCT",
                        help="exit 1 when the overall score is below PCT (default 95)")
    parser.add_argument("--root", type=Path, default=REPO, help=argparse.SUPPRESS)
    parser.add_argument("--targets", type=Path, default=HERE / "mutation_targets.toml", help="the module-to-tests map")
    parser.add_argument("--allow", type=Path, default=HERE / "mutation_allow.toml", help="the equivalent mutants")
    args = parser.parse_args(argv)
    if args.jobs < 1:
        parser.error("--jobs must be at least 1")
    return args


def plan(args: argparse.Namespace, source_root: Path, allowed: list[Allowed]) -> list[ModuleRun]:
    targets = [t for t in load_targets(args.targets) if not args.module or any(m in t.path for m in args.module)]
    if not targets:
        raise SystemExit(f"no module in {args.targets} matches {', '.join(args.module)}")
    runs = []
    for target in targets:
        source = (source_root / target.path).read_text()
        mutants = plant(target.path, source, target.scope)
        chosen = mutants
        if args.sample and len(mutants) > args.sample:
            chosen = sorted(random.Random(target.path).sample(mutants, args.sample), key=lambda m: m.index)
        run = ModuleRun(target, source, chosen, len(mutants))
        run.allowed = [a for a in allowed if a.path == target.path and not args.sample]  # a sample may leave one out
        runs.append(run)
    return runs


def _interrupted(_signum: int, _frame: object) -> None:
    raise KeyboardInterrupt


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    allowed = load_allowed(args.allow)
    signal.signal(signal.SIGTERM, _interrupted)  # so that the copies under /tmp are removed on the way out
    with tempfile.TemporaryDirectory(prefix="edgectl-mutants-") as tmp:
        first = Path(tmp) / "w0"
        copy_tree(args.root.resolve(), first, args.head)
        runs = plan(args, first, allowed)
        if args.list:
            list_mutants(runs, allowed, sys.stdout)
            return 0
        trees = [first] + [Path(tmp) / f"w{i}" for i in range(1, args.jobs)]
        for tree in trees[1:]:
            shutil.copytree(first, tree, symlinks=True)
        started = time.monotonic()
        workers: list[Worker] = []
        try:
            for tree in trees:
                workers.append(Worker(tree))
            baselines(workers, runs, args.timeout, sys.stderr)
            mutate(workers, runs, allowed, sys.stderr)
        except KeyboardInterrupt:
            for worker in workers:
                worker.stop()
            raise
        for worker in workers:
            worker.close()
    overall = report(runs, sys.stdout)
    sampled = f" (sampled: --sample {args.sample})" if any(len(r.mutants) < r.planted for r in runs) else ""
    print(f"\n{sum(len(r.results) for r in runs)} mutant(s) in {(time.monotonic() - started) / 60:.1f} min on "
          f"{args.jobs} worker(s){sampled}", file=sys.stdout)
    return 0 if overall is not None and overall >= args.fail_under else 1


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""The agent's HTTP chunk download against curl, both fetching the same file from the same server.

    .venv/bin/python scripts/bench_http.py [--mb 64] [--chunk-kib 64] [--runs 5]

``edgectl artifacts serve`` runs in its own process. The agent's side is the code a device runs
(agent.deploy.http_fetch.HttpFetch filling a Download: Range requests, sha256 of every chunk,
positioned writes into the .part file, fsync and rename); curl writes the same bytes to a file.
The figure is the best of ``--runs`` runs each; the goal is a ratio of at least 0.8.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from agent.deploy.download import Download
from agent.deploy.http_fetch import HttpFetch, HttpSettings
from agent.protocol.chunks import chunk_digests
from agent.protocol.manifest import PayloadInfo

__all__ = ["GOAL", "measure"]

GOAL = 0.8


def _serve(directory: Path) -> tuple[subprocess.Popen[str], str]:
    process = subprocess.Popen([sys.executable, "-m", "edgectl.cli.main", "artifacts", "serve", str(directory), "--port", "0"],
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                               env={**os.environ, "PYTHONUNBUFFERED": "1"})
    assert process.stdout is not None
    match = re.search(r"on (http://\S+?)/?$", process.stdout.readline().strip())
    if match is None:
        process.kill()
        raise SystemExit("edgectl artifacts serve did not start")
    return process, match[1]


def _curl(url: str, out: Path) -> float:
    start = time.perf_counter()
    subprocess.run(["curl", "-sS", "--fail", "-o", str(out), url], check=True)
    took = time.perf_counter() - start
    out.unlink()
    return took


def _agent(url: str, payload: PayloadInfo, workdir: Path) -> float:
    start = time.perf_counter()
    download = Download(workdir, payload)
    fetch = HttpFetch(HttpSettings())
    if not fetch.fetch(download, [url]):
        raise SystemExit(f"the agent's fetch did not complete: {len(download.have)} of {len(payload.chunks)} chunks")
    download.finish()
    took = time.perf_counter() - start
    shutil.rmtree(workdir)
    return took


def measure(mb: int = 64, chunk_kib: int = 64, runs: int = 5) -> dict[str, Any]:
    """Best-of-``runs`` seconds for curl and for the agent's fetch of the same ``mb`` MiB file, interleaved."""
    if shutil.which("curl") is None:
        raise SystemExit("curl is not installed: apt-get install curl")
    with tempfile.TemporaryDirectory(prefix="bench-http-") as tmp:
        root = Path(tmp) / "served"
        root.mkdir()
        source = root / "payload"
        with source.open("wb") as f:
            for _ in range(mb):
                f.write(os.urandom(1 << 20))
        size, chunk = source.stat().st_size, chunk_kib * 1024
        whole, chunks = chunk_digests(source, chunk)
        payload = PayloadInfo(size, whole, chunk, tuple(chunks))
        server, base = _serve(root)
        url = f"{base}/payload"
        try:
            curl_runs, agent_runs = [], []
            for i in range(runs):  # interleaved, so a busy moment on a shared machine hits both
                curl_runs.append(_curl(url, Path(tmp) / "curl.out"))
                agent_runs.append(_agent(url, payload, Path(tmp) / f"agent-{i}"))
        finally:
            server.terminate()
            server.wait(10)
    curl_s, agent_s = min(curl_runs), min(agent_runs)
    return {"size": size, "chunks": len(chunks), "chunk_kib": chunk_kib, "runs": runs, "curl_s": curl_s, "agent_s": agent_s,
            "ratio": curl_s / agent_s}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=int, default=64, help="payload size in MiB (default 64)")
    parser.add_argument("--chunk-kib", type=int, default=64, help="signed chunk size in KiB (default 64, as packages)")
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    got = measure(args.mb, args.chunk_kib, args.runs)
    mb, curl_s, agent_s, ratio = got["size"] / 1e6, got["curl_s"], got["agent_s"], got["ratio"]
    print(f"payload {mb:.1f} MB in {got['chunks']} chunks of {args.chunk_kib} KiB, best of {args.runs} runs, loopback")
    print(f"curl:  {curl_s:.3f} s  {mb / curl_s:8.1f} MB/s")
    print(f"agent: {agent_s:.3f} s  {mb / agent_s:8.1f} MB/s  (Range requests, sha256 per chunk, pwrite, fsync)")
    print(f"agent/curl throughput: {ratio:.2f} (goal >= {GOAL}: {'met' if ratio >= GOAL else 'NOT met'})")
    print(f"rerun: .venv/bin/python scripts/bench_http.py --mb {args.mb} --chunk-kib {args.chunk_kib} --runs {args.runs}")


if __name__ == "__main__":
    main()

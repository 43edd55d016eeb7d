"""The agent's HTTP layer measured apart (bench_agent.py part 3, through serving_bench.py).

- Pipelined throughput before and after the parser change: the hand-written ``http11.py`` of
  ``OLD_HTTP11`` (read from git) and the llhttp one, each serving ``/v2/health/live`` from the same
  harness, driven by ``h2load --h1`` with 16 pipelined requests per connection.
- ``ab -k``, ``wrk`` and ``h2load --h1`` against the agent server: failed requests must be zero.
- The parser choice: microseconds per request head for llhttp (httptools), h11 and the old parser.
- ``old_server_package``: the whole HTTP server of ``OLD_HTTP11``, for serving_bench's 1-client comparison.
"""

from __future__ import annotations

import importlib.util
import re
import shutil
import statistics
import subprocess
import sys
import timeit
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psutil

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from agent.serving.http_head import parse_head  # noqa: E402
from tests.checkout import checkout_env  # noqa: E402

__all__ = ["OLD_HTTP11", "h2load", "old_server_package", "parser_costs", "pipelined", "tools"]

OLD_HTTP11 = "5d559d7eda1547271b54abc360ba2459dbde6c97"  # the last commit with the hand-written HTTP parser
HEALTH = "/v2/health/live"

# Serves /v2/health/live through one http11 module's serve_connection, with nothing else around it.
_HARNESS = """
import asyncio, importlib.util, sys
from agent.serving.budget import ByteBudget
if sys.argv[1]:
    spec = importlib.util.spec_from_file_location("http11_under_test", sys.argv[1])
    mod = importlib.util.module_from_spec(spec); sys.modules[spec.name] = mod; spec.loader.exec_module(mod)
else:
    from agent.serving import http11 as mod
limits = mod.HttpLimits()
budget = getattr(mod, "ByteBudget", ByteBudget)(2**30)
async def handler(request):
    return mod.json_response(200, {"live": True})
async def main():
    server = await asyncio.start_server(
        lambda r, w: mod.serve_connection(r, w, limits, budget, lambda request, length: None, handler, False),
        "127.0.0.1", 0, limit=limits.max_header_bytes, backlog=1024)
    print(server.sockets[0].getsockname()[1], flush=True)
    await server.serve_forever()
asyncio.run(main())
"""


# -- the HTTP layer, before and after the parser change -------------------------------------------

@contextmanager
def harness(http11: Path | None) -> Iterator[tuple[int, psutil.Process]]:
    """A process serving /v2/health/live through ``http11`` (None: this checkout's): its port and process."""
    proc = subprocess.Popen([sys.executable, "-c", _HARNESS, str(http11 or "")], cwd=ROOT, stdout=subprocess.PIPE,
                            text=True, env=checkout_env())
    assert proc.stdout is not None
    try:
        yield int(proc.stdout.readline()), psutil.Process(proc.pid)
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def old_http11(work: Path) -> Path | None:
    """The hand-written http11.py of OLD_HTTP11, or None where git or that commit is missing."""
    try:
        text = subprocess.run(["git", "show", f"{OLD_HTTP11}:agent/serving/http11.py"], cwd=ROOT, capture_output=True,
                              text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return None
    path = work / "old_http11.py"
    path.write_text(text)
    return path


def old_server_package(work: Path) -> Path | None:
    """A directory holding ``old_serving/`` (server.py and http11.py of OLD_HTTP11), or None without git history."""
    package = work / "old" / "old_serving"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    for name in ("server.py", "http11.py"):
        try:
            text = subprocess.run(["git", "show", f"{OLD_HTTP11}:agent/serving/{name}"], cwd=ROOT, capture_output=True,
                                  text=True, check=True).stdout
        except (OSError, subprocess.CalledProcessError):
            return None
        text = text.replace("from agent.serving.http11 import", "from old_serving.http11 import")
        # /metrics is not measured; the old text writer is gone from agent.telemetry.
        text = text.replace("from agent.telemetry import prometheus_text", "prometheus_text = None")
        (package / name).write_text(text)
    return package.parent


def h2load(url: str, requests: int, clients: int, pipeline: int, extra: list[str] | None = None,
           seconds: float | None = None) -> dict[str, float]:
    """Requests per second and the outcome counts of one ``h2load --h1`` run (``requests`` of them, or ``seconds`` long)."""
    amount = ["-n", str(requests)] if seconds is None else ["-D", f"{seconds:g}"]
    out = subprocess.run(["h2load", "--h1", *amount, "-c", str(clients), "-m", str(pipeline), "-t", "1",
                          *(extra or []), url], capture_output=True, text=True, timeout=600).stdout
    rate = re.search(r"finished in [\d.]+\w+, ([\d.]+) req/s", out)
    counts = re.search(r"requests: (\d+) total, (\d+) started, (\d+) done, (\d+) succeeded, (\d+) failed, (\d+) errored, "
                       r"(\d+) timeout", out)
    status = re.search(r"status codes: (\d+) 2xx, (\d+) 3xx, (\d+) 4xx, (\d+) 5xx", out)
    if rate is None or counts is None or status is None:
        raise RuntimeError(f"h2load printed no summary:\n{out[-2000:]}")
    mean = re.search(r"time for request:\s+\S+\s+\S+\s+([\d.]+)(us|ms|s)", out)
    mean_ms = float(mean[1]) * {"us": 0.001, "ms": 1.0, "s": 1000.0}[mean[2]] if mean else float("nan")
    return {"rps": float(rate[1]), "done": int(counts[3]), "failed": int(counts[5]) + int(counts[6]) + int(counts[7]),
            "non_2xx": int(status[2]) + int(status[3]) + int(status[4]), "mean_ms": mean_ms}


def pipelined(work: Path, rounds: int, requests: int) -> dict[str, Any]:
    """req/s of old and new http11 (and the whole agent server) under pipelined health checks, interleaved."""
    old = old_http11(work)
    if old is None or shutil.which("h2load") is None:
        return {"skipped": f"needs git history (commit {OLD_HTTP11[:10]}) and h2load (nghttp2-client)"}
    names = {"old http11 (hand-written)": old, "new http11 (llhttp)": None}
    runs: dict[str, list[float]] = {name: [] for name in names}
    cpu_us: dict[str, list[float]] = {name: [] for name in names}
    for _ in range(rounds):
        for name, module in names.items():
            with harness(module) as (port, process):
                before = process.cpu_times()
                got = h2load(f"http://127.0.0.1:{port}{HEALTH}", requests, 4, 16)
                after = process.cpu_times()
                if got["failed"] or got["non_2xx"] or got["done"] != requests:
                    raise RuntimeError(f"{name}: pipelined run failed: {got}")
                runs[name].append(got["rps"])
                cpu_us[name].append(1e6 * (after.user + after.system - before.user - before.system) / requests)
    medians = {name: statistics.median(v) for name, v in runs.items()}
    cpu = {name: statistics.median(v) for name, v in cpu_us.items()}
    old_name, new_name = list(names)
    return {"runs": runs, "median": medians, "ratio": medians[new_name] / medians[old_name], "cpu_us": cpu_us,
            "cpu_median": cpu, "cpu_ratio": cpu[old_name] / cpu[new_name]}


# -- standard load tools --------------------------------------------------------------------------

def _ab(url: str, body: Path | None, header: str | None) -> dict[str, float]:
    args = ["ab", "-k", "-q", "-n", "5000", "-c", "8"]
    if body is not None:
        args += ["-p", str(body), "-T", "application/octet-stream", "-H", header or ""]
    out = subprocess.run([*args, url], capture_output=True, text=True, timeout=600).stdout
    rate = re.search(r"Requests per second:\s+([\d.]+)", out)
    failed = re.search(r"Failed requests:\s+(\d+)", out)
    non2xx = re.search(r"Non-2xx responses:\s+(\d+)", out)
    complete = re.search(r"Complete requests:\s+(\d+)", out)
    if rate is None or failed is None or complete is None:
        raise RuntimeError(f"ab printed no summary:\n{out[-2000:]}")
    return {"rps": float(rate[1]), "done": int(complete[1]), "failed": int(failed[1]),
            "non_2xx": int(non2xx[1]) if non2xx else 0}


def _wrk(url: str, body: Path | None, header: str | None, work: Path) -> dict[str, float]:
    args = ["wrk", "-t", "2", "-c", "8", "-d", "4s"]
    if body is not None:
        raw = "".join(f"\\{b:03d}" for b in body.read_bytes())
        name, value = (header or ":").split(":", 1)
        script = work / "post.lua"
        script.write_text(f'wrk.method = "POST"\nwrk.body = "{raw}"\nwrk.headers["{name}"] = "{value.strip()}"\n'
                          'wrk.headers["Content-Type"] = "application/octet-stream"\n')
        args += ["-s", str(script)]
    out = subprocess.run([*args, url], capture_output=True, text=True, timeout=600).stdout
    rate = re.search(r"Requests/sec:\s+([\d.]+)", out)
    done = re.search(r"(\d+) requests in", out)
    errors = re.search(r"Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)", out)
    non2xx = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    if rate is None or done is None:
        raise RuntimeError(f"wrk printed no summary:\n{out[-2000:]}")
    return {"rps": float(rate[1]), "done": int(done[1]), "failed": sum(map(int, errors.groups())) if errors else 0,
            "non_2xx": int(non2xx[1]) if non2xx else 0}


def tools(port: int, model: str, body_bytes: bytes, json_length: int, work: Path) -> list[dict[str, Any]]:
    """ab -k, wrk and h2load --h1 on the health check and a small binary inference (``body_bytes``): counts of failures."""
    if missing := [t for t in ("ab", "wrk", "h2load") if shutil.which(t) is None]:
        return [{"tool": ", ".join(missing), "skipped": "not installed (apache2-utils, wrk, nghttp2-client)"}]
    body = work / "small.bin"
    body.write_bytes(body_bytes)
    header = f"Inference-Header-Content-Length: {json_length}"
    base = f"http://127.0.0.1:{port}"
    infer_url = f"{base}/v2/models/{model}/infer"
    h2_post = ["-d", str(body), "-H", header, "-H", "Content-Type: application/octet-stream"]
    rows = []
    for target, url, post in (("GET /v2/health/live", base + HEALTH, None), ("POST infer 1x4 binary", infer_url, body)):
        runs: dict[str, Callable[[str, Path | None], dict[str, float]]] = {
            "ab -k -c 8": lambda url, post: _ab(url, post, header),
            "wrk -c 8": lambda url, post: _wrk(url, post, header, work),
            "h2load --h1 -c 8": lambda url, post: h2load(url, 5000, 8, 1, h2_post if post else None)}
        for tool, run in runs.items():
            rows.append({"tool": tool, "target": target, **run(url, post)})
            print(f"  {tool:18s} {target:24s} {rows[-1]['rps']:9.1f} req/s  done {rows[-1]['done']}  "
                  f"failed {rows[-1]['failed']}  non-2xx {rows[-1]['non_2xx']}")
    return rows


# -- the parser choice ----------------------------------------------------------------------------

HEAD = (b"POST /v2/models/m/infer HTTP/1.1\r\nHost: 127.0.0.1:8080\r\nUser-Agent: Python-urllib/3.11\r\n"
        b"Accept-Encoding: identity\r\nContent-Type: application/octet-stream\r\nContent-Length: 602212\r\n"
        b"Inference-Header-Content-Length: 150\r\n\r\n")


def parser_costs(work: Path, number: int = 20000) -> dict[str, float]:
    """Microseconds to parse one request head (best of 5 repeats), per parser."""
    costs: dict[str, Callable[[], object]] = {"llhttp (httptools), as served": lambda: parse_head(HEAD, "")}
    try:
        import h11

        def with_h11() -> object:
            conn = h11.Connection(h11.SERVER)
            conn.receive_data(HEAD)
            return conn.next_event()

        costs["h11"] = with_h11
    except ImportError:
        pass
    old = old_http11(work)
    if old is not None:
        spec = importlib.util.spec_from_file_location("old_http11", old)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules["old_http11"] = module  # dataclasses look their module up while they are built
        spec.loader.exec_module(module)
        text = HEAD.decode("latin-1")
        costs["hand-written (before)"] = lambda: module._parse_head(text, "")
    return {name: min(timeit.repeat(fn, number=number, repeat=5)) / number * 1e6 for name, fn in costs.items()}



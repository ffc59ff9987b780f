#!/usr/bin/env python3
"""The same load sent straight to a sim engine and through `llmgw gateway`, in one run.

    apt-get install wrk    # the default load generator (Debian's package)
    .venv/bin/python hack/bench/gateway.py [--concurrency 64] [--seconds 10] [--slice 1] [--max-tokens 4]
                                           [--generator wrk|python] [--endpoint completions|chat|responses]
                                           [--beside completions|chat|responses]

Starts a sim engine (no token delay) and a gateway (--static routes to that
engine) as their own processes, then the load generator: --concurrency
keep-alive connections, each sending short non-streaming completions (or, with
`--endpoint responses`, Responses API calls without `store`) back to back.
`wrk` (the default: C, one thread, a fraction of the CPU per request of
any Python client) or `--generator python` (aiohttp clients in a third Python
process, the generator until 2026-12-04). The generator alternates between the
engine and the gateway in --slice second turns (ABBA order; wrk's turns are
whole seconds) until each has had --seconds: on a shared machine, a run of one
after the other mostly measures what else was running at the time. Reports
requests/s and p50/p99 latency both ways and their ratios, and the CPU time per
request of the engine and of the gateway (from /proc; the steadiest figure on a
busy machine). The last line is `throughput_ratio=<r> added_p50_ms=<m>`: the
throughput ratio at --concurrency, and the p50 the hop adds for a single client
(at saturation p50 is queueing, concurrency / throughput, so the loaded p50
difference is printed above it but is not the hop's cost). Targets: ratio >=
0.7, added p50 <= 1 ms. wrk's percentiles include the samples it adds for
stalls (its coordinated-omission correction), the same on both paths.

Why wrk (2026-12-04). On two cores the generator, the engine and the gateway
share the CPU, so what the generator costs per request is taken from the other
two. The aiohttp generator cost more per request than the gateway itself (about
125-140 us against 40-150), and the throughput ratio it measured was mostly the
generator's share of the cores. With wrk the gateway fits beside the engine,
the engine is the bottleneck on both paths, and the ratio is about 1. It comes
out above 1 in most runs because the engine itself costs more per request when
wrk drives it directly (72-90 us) than through the gateway (62-70 us); the
benchmark prints both. The likely cause: wrk sends the next request the moment
an answer arrives, so the engine's loop wakes for one request at a time, while
the gateway hands requests on in bursts. With the python generator (slower, so
bursty too) the engine cost the same both ways (140 us and 140 us in one run).
So a ratio above 1 says the gateway is not what limits throughput here, not
that it makes engines faster. Same build, same machine, same day, interleaved,
`--seconds 8`:
    --generator python: throughput_ratio 0.61, 0.64 (added_p50_ms 0.19, 0.19);
        gateway 56-63 us per request, engine 92-101 us
    --generator wrk:    throughput_ratio 0.98, 0.87 (added_p50_ms 0.15, 0.15);
        gateway 51-56 us per request, engine 72-76 us
Then with wrk, `--seconds 10`, eight runs: throughput_ratio 0.92-1.25 (1.16,
1.06, 1.22, 0.92, 1.17, 1.25, 1.02, 1.13); added_p50_ms 0.11-0.14; gateway 40-61 us
per request, 0.63-0.69 of the engine's. A typical run:
    direct  c=64   13919 req/s  p50   4.21 ms  p99   8.79 ms  (140782 ok, 0 failed)
    gateway c=64   15770 req/s  p50   3.60 ms  p99   8.64 ms  (158108 ok, 0 failed)
    direct  c=1     5867 req/s  p50   0.17 ms  p99   0.41 ms  (63939 ok, 0 failed)
    gateway c=1     3358 req/s  p50   0.28 ms  p99   0.60 ms  (36255 ok, 0 failed)
    cpu per request: engine 67 us, gateway 43 us (gateway/engine 0.65); the engine's while the load
        went direct 72 us, through the gateway 62 us
    c=64: throughput ratio 1.13, p50 ratio 0.86, p99 ratio 0.98, added p50 -0.61 ms
    c=1: throughput ratio 0.57, p50 ratio 1.71, p99 ratio 1.45
    throughput_ratio=1.13 added_p50_ms=0.12
2026-12-06, `--endpoint` (the Responses API, each response's replica remembered), `--seconds 4`,
runs alternated completions, responses, completions, responses, load average 6-9 (other test
runs): added_p50_ms 0.50, 0.62, 0.34, 0.40 (responses minus completions +0.12 and +0.06 ms, in
the noise of a run to the next); throughput_ratio 0.76, 0.87, 0.62, 0.67.
2026-12-06, response ids naming their replica (rewritten in every body: no map),
`--endpoint responses --beside chat --seconds 16` (8 one-client turns of each, alternated), on the
shared 2-core machine at load average 8-15 (a turn's added p50 spreads from -3.5 to 11 ms, so one
run's median moves by tenths of a ms): responses_minus_chat_ms -0.004, +0.261, -0.016 (reversed:
`--endpoint chat --beside responses`, chat minus responses +0.018); gateway CPU per request then
350/274 and 307/275 us (responses/chat). cProfile put the gap in Relabel's construction (a base64
and a closure per response, 20 us of a profiled request's 700) and the Endpoint step (20 us, the
model's replicas checked for the endpoint); the replica's tag made once (lru_cache) since, one
run at load average 10: `added_p50_ms_responses=0.570 added_p50_ms_chat=0.657
responses_minus_chat_ms=-0.087 gateway_cpu_us_responses=308 gateway_cpu_us_chat=317`. Within the
0.1 ms target in every run but one, which the noise here cannot tell apart; a quiet machine
would settle it.
(The machine was about twice as fast as on 2026-12-03: the engine cost 64-101
us per request, 224-270 us the day before.) The figures below were taken with
the python generator.

Measured on the 2-core development machine, shared with other test runs
(load average 3-7), 2026-12-02, `--seconds 8`, uvloop in all three
processes; three runs each, median first:
    before (aiohttp client per request): throughput_ratio 0.39 (0.35, 0.54)
        added_p50_ms 0.57 (0.44, 0.62); CPU per request gateway/engine 2.2 (2.1-2.35)
    after (lean keep-alive pool on httptools, lock-free request metrics), five runs:
        throughput_ratio 0.58 (0.51-0.70) added_p50_ms 0.32 (0.27-0.40);
        CPU per request gateway/engine 1.04 (1.03-1.16), e.g. engine 130 us, gateway 134 us
    after (client side on the gateway's own server, httptools' request parser, instead of
    aiohttp's), three runs, load average 1-2: throughput_ratio 0.62 (0.60-0.68) added_p50_ms 0.23 (0.20-0.24);
        CPU per request gateway 90 us (81-97), engine 135 us (117-137), gateway/engine 0.69 (0.66-0.71)
    2026-12-03, the same build, three runs, load average 0.1-1.7 (a slower day: the engine
        cost 236-241 us per request): throughput_ratio 0.68, 0.64, 0.68 added_p50_ms 0.22,
        0.36, 0.49; CPU per request gateway 152-154 us, gateway/engine 0.64. py-spy on the gateway
        under this load: about half its samples in uvloop's own code (socket I/O, epoll), 17% in
        the two transport writes per request, the Python of server and proxy under a third
    2026-12-03 later, unchanged build: throughput_ratio=0.67 added_p50_ms=0.24; CPU per request
        gateway 153 us, engine 231 us (0.66)
    2026-12-03 evening: the common exchange without a task (server.py's `begin`,
        proxy.py's _Exchange: the body at hand, an idle connection, a small whole
        response), three runs interleaved with three of the build before
        (`--seconds 8`): throughput_ratio 0.66, 0.73, 0.71 against 0.62, 0.63, 0.68;
        added_p50_ms 0.22-0.27 against 0.23-0.49; CPU per request gateway 131-145 us
        against 139-162. perf on the gateway before it: 55% in libpython (a fifth in
        the bytecode loop), 30% in the kernel, 6% uvloop, 5% httptools; py-spy put
        2% in the loop's weak set of tasks alone. A throwaway prototype measured the
        same: 0.68-0.72 against 0.63-0.70 in five pairs. Three more runs of the
        build: 0.71, 0.69, 0.66 (gateway 137-161 us per request, 0.58-0.60 of the
        engine's); four more later: 0.81, 0.69, 0.71, 0.69. Ten runs: 0.66-0.81,
        median 0.70, five of them at 0.70 or more.
A typical run with the python generator, 2026-12-03:
    direct  c=64    6952 req/s  p50   9.22 ms  p99  14.53 ms
    gateway c=64    4721 req/s  p50  12.83 ms  p99  24.79 ms
    direct  c=1     2058 req/s  p50   0.44 ms  p99   1.10 ms
    gateway c=1     1418 req/s  p50   0.67 ms  p99   1.64 ms
With the python generator the added p50 met its target; the throughput ratio met it in some
runs, not reliably (ten runs 0.66-0.81, median 0.70, with the exchange without a task). Engine (E),
load generator (L) and gateway (G) are all CPU-bound on two cores, so the ratio
is about (L + E) / (L + E + G) at best, and E and L themselves cost more per
request when a third busy process shares the cores (more preemptions): measured
gateway-only, E ~121 us and L ~142 us vs ~104 and ~125 direct. A byte pipe in
place of the gateway (uvloop, no HTTP at all; a lower bound for any Python
gateway, 37 us per request) measured 0.76 under the same load, E and L inflated
just the same. Reaching 0.7 needs G near 60 us; what is left of its 90 us is four
loopback syscalls per request (read and write on each side: most of the pipe's
37 us) and the proxy itself in Python (parse, route, balance, metrics; no task
per request since the exchange without one). A core of the gateway's own, or several gateways, is the remedy.
Under heavier outside load each process gets a share of a core rather than a
core, and the ratio moves towards max(L, E) / max(L, E, G) (not measured).
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Iterator

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from llmgw.dev.process import free_port, wait_http  # noqa: E402

ROUTES = """\
apiVersion: llmgw.io/v1
kind: Model
metadata: {{name: bench}}
spec: {{profiles: [{{engine: sim}}]}}
---
apiVersion: llmgw.io/v1
kind: Replica
metadata: {{name: bench-0}}
spec: {{model: bench, templateHash: bench, profile: {{engine: sim}}, servedModelNames: [bench]}}
status: {{phase: Ready, endpoint: "127.0.0.1:{port}"}}
"""



def wait_up(url: str, proc: subprocess.Popen, timeout: float = 20.0) -> None:
    def alive() -> None:
        if proc.poll() is not None:
            raise SystemExit(f"{proc.args[:3]} exited with {proc.returncode}")
    wait_http(url, alive, str(proc.args[:3]), timeout=timeout)


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process so far (Linux /proc; NaN elsewhere)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return float("nan")


def stop(procs: list[subprocess.Popen]) -> None:
    """SIGTERM to all, then wait for each (killed after 15 s)."""
    for proc in procs:
        proc.send_signal(signal.SIGTERM)
    for proc in procs:
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()


# ------------------------------------------------------------------ load generators

def _turns(urls: list[str], slices: int) -> Iterator[str]:
    """The targets in turn, `slices` rounds in ABBA order: the same outside load on both."""
    for k in range(slices):
        yield from (urls if k % 2 == 0 else urls[::-1])


def _summary(latencies_s: list[float], ok: int, failures: int, sent: int, elapsed: float,
             engine_cpu: float) -> dict:
    """`sent` includes the warm-up (for CPU per request); the rest is the measured slices.

    engine_us: the engine's CPU per request while this target had the load, so the two
    paths' engine costs can be told apart.
    """
    lat = sorted(latencies_s)
    n = len(lat)
    return {
        "requests": ok, "failures": failures, "sent": sent, "rps": ok / elapsed if elapsed else 0.0,
        "engine_us": engine_cpu / ok * 1e6 if ok else float("nan"),
        "p50_ms": lat[n // 2] * 1000 if n else float("nan"),
        "p99_ms": lat[min(n - 1, int(n * 0.99))] * 1000 if n else float("nan"),
    }


# wrk (C, one thread, epoll) costs a fraction of a Python client per request, so on two cores
# the engine and the gateway get the CPU the aiohttp generator took. done() prints the counts and
# the whole latency histogram (microseconds) so that the slices of one target can be merged.
WRK_SCRIPT = """\
wrk.method = "POST"
wrk.body = [[%s]]
wrk.headers["Content-Type"] = "application/json"
function done(summary, latency, requests)
  local e = summary.errors
  io.write(string.format("wrk-result %%d %%d %%d %%d\\n", summary.requests, summary.duration,
                         e.connect + e.read + e.write + e.timeout, e.status))
  local parts = {}
  for i = 1, #latency do
    local value, count = latency(i)
    parts[#parts + 1] = string.format("%%d:%%d", value, count)
  end
  io.write("wrk-latency ", table.concat(parts, " "), "\\n")
end
"""


def _wrk(url: str, connections: int, seconds: int, script: Path) -> dict:
    """One wrk run: completed requests, failed ones, its duration and its latency histogram."""
    out = subprocess.run(
        ["wrk", "-t1", f"-c{connections}", f"-d{seconds}s", "--timeout", "10s", "-s", str(script), url],
        check=True, capture_output=True, text=True).stdout
    result = hist = None
    for line in out.splitlines():
        if line.startswith("wrk-result "):
            result = [int(x) for x in line.split()[1:]]
        elif line.startswith("wrk-latency"):
            hist = {int(v): int(c) for v, c in (pair.split(":") for pair in line.split()[1:])}
    if result is None or hist is None:
        raise SystemExit(f"wrk printed no result for {url}:\n{out}")
    responses, duration_us, socket_errors, bad_status = result  # responses include bad statuses
    return {"sent": responses + socket_errors, "ok": responses - bad_status, "elapsed": duration_us / 1e6,
            "failures": socket_errors + bad_status, "hist": hist}


def load_wrk(urls: list[str], concurrency: int, seconds: float, body: str, slice_s: float,
             engine_pid: int) -> dict:
    """As load_python, with wrk; its durations are whole seconds, so a slice is at least 1 s."""
    if shutil.which("wrk") is None:
        raise SystemExit("wrk not found: apt-get install wrk (or --generator python)")
    slice_s = max(1, round(slice_s))
    with tempfile.TemporaryDirectory() as tmp:
        script = Path(tmp, "post.lua")
        script.write_text(WRK_SCRIPT % body)
        stats = {u: {"hist": {}, "ok": 0, "failures": 0, "elapsed": 0.0, "sent": 0, "engine_cpu": 0.0}
                 for u in urls}
        for url in urls:  # warm up: connections, caches
            stats[url]["sent"] += _wrk(url, concurrency, 1, script)["sent"]
        for url in _turns(urls, max(1, round(seconds / slice_s))):
            st, cpu0 = stats[url], cpu_seconds(engine_pid)
            r = _wrk(url, concurrency, slice_s, script)
            st["engine_cpu"] += cpu_seconds(engine_pid) - cpu0
            for field in ("sent", "ok", "failures"):
                st[field] += r[field]
            st["elapsed"] += r["elapsed"]
            for value, count in r["hist"].items():
                st["hist"][value] = st["hist"].get(value, 0) + count
    out = {}
    for url, st in stats.items():
        # wrk's histogram also holds the samples it adds for stalls (its coordinated-omission
        # correction): percentiles come from it, the request count from what completed.
        latencies = [v / 1e6 for v, c in sorted(st["hist"].items()) for _ in range(c)]
        out[url] = _summary(latencies, st["ok"], st["failures"], st["sent"], st["elapsed"], st["engine_cpu"])
    return out


async def _load_python(urls: list[str], concurrency: int, seconds: float, body: str,
                       slice_s: float, engine_pid: int) -> dict:
    """Each url gets `seconds` of load, in slices of `slice_s` taken in turn (ABBA order).

    Interleaving short slices makes both targets see the same outside load: on a
    shared machine a sequential A-then-B run mostly measures what else ran when.
    """
    import aiohttp
    headers = {"Content-Type": "application/json"}
    stats = {u: {"latencies": [], "failures": 0, "elapsed": 0.0, "sent": 0, "engine_cpu": 0.0} for u in urls}
    sessions = {u: aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=concurrency)) for u in urls}
    try:
        async def client(url: str, stop_at: float, record: bool) -> None:
            session, st = sessions[url], stats[url]
            while time.perf_counter() < stop_at:
                t0 = time.perf_counter()
                try:
                    async with session.post(url, data=body.encode(), headers=headers) as r:
                        await r.read()
                        ok = r.status == 200
                except aiohttp.ClientError:
                    ok = False
                st["sent"] += 1
                if not record:
                    continue
                if ok:
                    st["latencies"].append(time.perf_counter() - t0)
                else:
                    st["failures"] += 1

        async def run(url: str, duration: float, record: bool) -> None:
            t0, cpu0 = time.perf_counter(), cpu_seconds(engine_pid)
            await asyncio.gather(*(client(url, t0 + duration, record) for _ in range(concurrency)))
            if record:
                stats[url]["elapsed"] += time.perf_counter() - t0
                stats[url]["engine_cpu"] += cpu_seconds(engine_pid) - cpu0

        for url in urls:  # warm up: connections, caches
            await run(url, min(1.0, seconds / 5), False)
        slices = max(1, round(seconds / slice_s))
        for url in _turns(urls, slices):
            await run(url, seconds / slices, True)
    finally:
        for session in sessions.values():
            await session.close()
    return {url: _summary(st["latencies"], len(st["latencies"]), st["failures"], st["sent"], st["elapsed"],
                          st["engine_cpu"])
            for url, st in stats.items()}


def python_generator_main(argv: list[str]) -> None:
    concurrency, seconds, body, slice_s, engine_pid = \
        int(argv[0]), float(argv[1]), argv[2], float(argv[3]), int(argv[4])
    try:
        import uvloop
        run = uvloop.run
    except ImportError:
        run = asyncio.run
    print(json.dumps(run(_load_python(argv[5:], concurrency, seconds, body, slice_s, engine_pid))))


def load_python(urls: list[str], concurrency: int, seconds: float, body: str, slice_s: float,
                engine_pid: int) -> dict:
    """aiohttp clients in a process of their own (never on the gateway's event loop)."""
    out = subprocess.run(
        [sys.executable, __file__, "--load-generator", str(concurrency), str(seconds),
         body, str(slice_s), str(engine_pid), *urls],
        check=True, capture_output=True, text=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


GENERATORS = {"wrk": load_wrk, "python": load_python}


ENDPOINTS = ("completions", "chat", "responses")


def request(endpoint: str, max_tokens: int) -> tuple[str, str]:
    """The path and the JSON body of the requests sent."""
    if endpoint == "responses":   # not stored: the sim would keep every one
        return "/v1/responses", json.dumps({"model": "bench", "input": "hello", "max_output_tokens": max_tokens,
                                            "store": False})
    if endpoint == "chat":
        return "/v1/chat/completions", json.dumps({"model": "bench", "max_tokens": max_tokens,
                                                   "messages": [{"role": "user", "content": "hello"}]})
    return "/v1/completions", json.dumps({"model": "bench", "prompt": "hello", "max_tokens": max_tokens})


def added_p50_beside(load, endpoints: tuple[str, str], engine: str, gateway: str, max_tokens: int,
                     turns: int, slice_s: float, engine_pid: int,
                     gateway_pid: int) -> tuple[dict[str, list[float]], dict[str, float]]:
    """Each endpoint's added p50 for one client, in `turns` turns each taken in ABBA order
    (each turn alternates engine and gateway itself): the two endpoints see the same outside load.
    And the gateway's CPU per request (us) of each over all its turns: steadier than a latency
    on a busy machine."""
    added: dict[str, list[float]] = {e: [] for e in endpoints}
    cpu = {e: [0.0, 0] for e in endpoints}   # seconds, requests sent through the gateway
    for endpoint in _turns(list(endpoints), turns):
        path, body = request(endpoint, max_tokens)
        cpu0 = cpu_seconds(gateway_pid)
        r = load([engine + path, gateway + path], 1, 2 * slice_s, body, slice_s, engine_pid)
        cpu[endpoint][0] += cpu_seconds(gateway_pid) - cpu0
        cpu[endpoint][1] += r[gateway + path]["sent"]
        added[endpoint].append(r[gateway + path]["p50_ms"] - r[engine + path]["p50_ms"])
    return added, {e: seconds / sent * 1e6 for e, (seconds, sent) in cpu.items()}


# ------------------------------------------------------------------ main

def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--load-generator":
        return python_generator_main(sys.argv[2:])
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--concurrency", type=int, default=64)
    p.add_argument("--seconds", type=float, default=10.0, help="of load on each target, at each concurrency")
    p.add_argument("--slice", type=float, default=1.0, help="seconds per turn when alternating targets")
    p.add_argument("--max-tokens", type=int, default=4)
    p.add_argument("--generator", choices=sorted(GENERATORS), default="wrk",
                   help="wrk (Debian's wrk; the default) or python (aiohttp clients, the generator "
                        "before 2026-12-04: it costs more CPU per request than the gateway)")
    p.add_argument("--gateway-arg", action="append", default=[], help="extra argument for llmgw gateway")
    p.add_argument("--endpoint", choices=ENDPOINTS, default="completions")
    p.add_argument("--beside", choices=ENDPOINTS,
                   help="also the added p50 (one client) of --endpoint and of this one, in alternating turns "
                        "(--seconds of them each), e.g. --endpoint responses --beside chat")
    args = p.parse_args()
    path, body = request(args.endpoint, args.max_tokens)

    llmgw = [sys.executable, "-m", "llmgw.cli.main"] if not (ROOT / ".venv/bin/llmgw").exists() \
        else [str(ROOT / ".venv/bin/llmgw")]
    engine_port, gw_port = free_port(), free_port()
    procs: list[subprocess.Popen] = []
    with tempfile.TemporaryDirectory() as tmp:
        routes = Path(tmp, "routes.yaml")
        routes.write_text(ROUTES.format(port=engine_port))
        try:
            procs.append(subprocess.Popen(
                [*llmgw, "sim", "--host", "127.0.0.1", "--port", str(engine_port),
                 "--served-model-name", "bench", "--tokens-per-second", "0"],
                stdout=subprocess.DEVNULL, stderr=open(Path(tmp, "sim.log"), "w")))
            procs.append(subprocess.Popen(
                [*llmgw, "gateway", "--listen", f"127.0.0.1:{gw_port}", "--static", str(routes),
                 "--log-level", "warning",
                 "--max-conns-per-addr", "0",  # every connection of the generator comes from 127.0.0.1
                 *args.gateway_arg],
                stdout=subprocess.DEVNULL, stderr=open(Path(tmp, "gateway.log"), "w")))
            wait_up(f"http://127.0.0.1:{engine_port}/health", procs[0])
            wait_up(f"http://127.0.0.1:{gw_port}/healthz", procs[1])
            engine_base, gw_base = f"http://127.0.0.1:{engine_port}", f"http://127.0.0.1:{gw_port}"
            engine_url, gw_url = engine_base + path, gw_base + path
            cpu0 = [cpu_seconds(p.pid) for p in procs]
            load = GENERATORS[args.generator]
            loaded = load([engine_url, gw_url], args.concurrency, args.seconds, body, args.slice, procs[0].pid)
            cpu1 = [cpu_seconds(p.pid) for p in procs]
            # One client, back to back: the hop's own latency, without queueing behind 63 others.
            single = load([engine_url, gw_url], 1, args.seconds, body, args.slice, procs[0].pid)
            beside = None if args.beside is None else added_p50_beside(
                load, (args.endpoint, args.beside), engine_base, gw_base, args.max_tokens,
                max(2, round(args.seconds / 2)), args.slice, procs[0].pid, procs[1].pid)
        finally:
            stop(procs)
    direct, via = loaded[engine_url], loaded[gw_url]
    direct1, via1 = single[engine_url], single[gw_url]
    print(f"generator={args.generator} endpoint={args.endpoint} cpus={os.cpu_count()} seconds={args.seconds} "
          f"slice={args.slice} max_tokens={args.max_tokens} "
          f"load average {os.getloadavg()[0]:.1f}")
    rows = ((f"direct  c={args.concurrency}", direct), (f"gateway c={args.concurrency}", via),
            ("direct  c=1", direct1), ("gateway c=1", via1))
    for name, r in rows:
        print(f"{name:12s} {r['rps']:7.0f} req/s  p50 {r['p50_ms']:6.2f} ms  p99 {r['p99_ms']:6.2f} ms  "
              f"({r['requests']} ok, {r['failures']} failed)")
    # CPU per request at c=64 (warm-up included on both sides of the division): the engine
    # served every request, the gateway only the proxied ones.
    engine_us = (cpu1[0] - cpu0[0]) / (direct["sent"] + via["sent"]) * 1e6
    gw_us = (cpu1[1] - cpu0[1]) / via["sent"] * 1e6
    print(f"cpu per request: engine {engine_us:.0f} us, gateway {gw_us:.0f} us "
          f"(gateway/engine {gw_us / engine_us:.2f}); the engine's while the load went direct "
          f"{direct['engine_us']:.0f} us, through the gateway {via['engine_us']:.0f} us")
    ratio = via["rps"] / direct["rps"] if direct["rps"] else 0.0
    print(f"c={args.concurrency}: throughput ratio {ratio:.2f}, p50 ratio {via['p50_ms'] / direct['p50_ms']:.2f}, "
          f"p99 ratio {via['p99_ms'] / direct['p99_ms']:.2f}, added p50 {via['p50_ms'] - direct['p50_ms']:.2f} ms")
    print(f"c=1: throughput ratio {via1['rps'] / direct1['rps']:.2f}, "
          f"p50 ratio {via1['p50_ms'] / direct1['p50_ms']:.2f}, p99 ratio {via1['p99_ms'] / direct1['p99_ms']:.2f}")
    # added_p50_ms is the unloaded hop (c=1): at saturation p50 is queueing, concurrency / throughput.
    figures = f"throughput_ratio={ratio:.2f} added_p50_ms={via1['p50_ms'] - direct1['p50_ms']:.2f}"
    if beside is not None:
        ends, (added, cpu) = (args.endpoint, args.beside), beside
        medians = {e: statistics.median(added[e]) for e in ends}
        for e in ends:
            print(f"c=1 turn by turn, added p50 of {e}: {' '.join(f'{x:.3f}' for x in added[e])} ms; "
                  f"gateway cpu {cpu[e]:.0f} us per request (warm-up included)")
        figures += "".join(f" added_p50_ms_{e}={medians[e]:.3f}" for e in ends)
        figures += f" {args.endpoint}_minus_{args.beside}_ms={medians[args.endpoint] - medians[args.beside]:.3f}"
        figures += "".join(f" gateway_cpu_us_{e}={cpu[e]:.0f}" for e in ends)
    print(figures)


if __name__ == "__main__":
    main()

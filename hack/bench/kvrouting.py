#!/usr/bin/env python3
"""precise-prefix (the engines' KV events) against prefix-score (a guess), on a workload shaped like llm-d's.

    .venv/bin/python hack/bench/kvrouting.py [--replicas 4] [--tenants 48] [--context-words 1500] [--seconds 20]

N sim engines with the step model publish their KV events (--kv-events-config,
PYTHONHASHSEED=0, as the renderers start them) behind `llmgw gateway --static`.
Many tenants each have a long context of their own (--context-words words; a
word is a token), asked short one-off questions (Poisson arrivals at --rate), so
the working set (tenants x context) is larger than one engine's cache
(--kv-cache-tokens) and engines evict. The same seeded schedule goes through
prefix-score and then precise-prefix, the engines' caches emptied before each.
Per policy: TTFT p50/p90 (to the first content token), the engines' hit rate
(cached / prompt tokens), and `agreement`: the share of requests whose cached
tokens, as the engine reported them, match within one block what the gateway's
index predicts (the most leading blocks any replica holds, read from an index this
process keeps from the same events at the moment it sends). Then, in this process,
what precise-prefix's key and pick cost per request (tokenizing, hashing into
vLLM's block keys, the lookup) on prompts of --route-words words against an index
that holds them, p50 and p99. LAST:
`kvrouting: precise_vs_prefix_ttft_p90=<prefix-score p90 / precise-prefix p90> agreement=<>
hit_rate_precise=<> hit_rate_prefix=<> route_ms_p50=<> route_ms_p99=<>`.
Targets (issue 46): ratio >= 3, agreement >= 0.95, route_ms p50 <= 1 and p99 <= 3 at 8k tokens.

`route_ms` times prompts seen before (kvblocks remembers the word ids of recent texts
and the hashes of recent blocks, as a repeated long context's are).

Measured 2026-12-06 on the 2-core development machine shared with six other
helpers' builds and tests (load average 4.5 in the first run, 13.6 in the
second), defaults, `--seconds 15` (177 requests a policy); the latencies are noise
at that load, the hit rates and agreement are not:
    prefix-score     12.0 req/s  ttft p50     311 ms p90     696 ms  hit 0.49  (177 ok, 0 failed)
    precise-prefix   12.0 req/s  ttft p50     314 ms p90     961 ms  hit 0.50  (177 ok, 0 failed)
    kvrouting: precise_vs_prefix_ttft_p90=0.72 agreement=0.87 hit_rate_precise=0.50 hit_rate_prefix=0.49
        route_ms_p50=14.48 route_ms_p99=52.53
The first run, before a prompt cached nowhere went where prefix-score would send it
(it went to the least loaded, spreading a tenant's context): hit 0.45 (prefix-score)
against 0.50, TTFT p90 ratio 0.69, agreement 0.86, route_ms p50 7.50, p99 26.87.
Since the word ids of recent texts are remembered too, the route line alone (route_ms(),
load average 10-12): route_ms_p50=0.67 route_ms_p99=2.88; an 8k-word prompt seen for the
first time costs 8 ms p50 (a CRC-32 per word and a sha256 of CBOR per block, in Python).
The whole benchmark again then (load average 9.8):
    prefix-score     12.0 req/s  ttft p50     311 ms p90     682 ms  hit 0.45  (177 ok, 0 failed)
    precise-prefix   12.0 req/s  ttft p50     312 ms p90    1029 ms  hit 0.50  (177 ok, 0 failed)
    kvrouting: precise_vs_prefix_ttft_p90=0.66 agreement=0.88 hit_rate_precise=0.50 hit_rate_prefix=0.45
        route_ms_p50=0.75 route_ms_p99=8.81
precise-prefix's TTFT p90 was the worse in every run (0.66-0.72x): a context it knows to be
on one replica stays there until the load bound, where prefix-score's guess spreads a
hot tenant sooner; not looked into further.
The other targets are not met: on this workload the two policies cache about as well (a
tenant's context is evicted everywhere as often as the guess is wrong), and 13% of the
predictions miss by more than a block (the engine admits the request after its queue,
when other requests have stored or evicted since it was sent).
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from gateway import stop, wait_up  # noqa: E402  (hack/bench/gateway.py)
from routing import pct, run_policy, words  # noqa: E402  (hack/bench/routing.py)

from llmgw.dev.process import free_port  # noqa: E402
from llmgw.kvevents import wire  # noqa: E402
from llmgw.kvevents.subscriber import Subscription  # noqa: E402
from llmgw.routing.kvblocks import BlockHasher, request_token_ids  # noqa: E402
from llmgw.routing.kvindex import KVIndex  # noqa: E402

BLOCK = 16


def workload(args: argparse.Namespace) -> list[tuple[float, dict]]:
    rnd = random.Random(args.seed)
    contexts = [words(rnd, f"t{k}w", args.context_words) for k in range(args.tenants)]
    out, t = [], 0.0
    while True:
        t += rnd.expovariate(args.rate)
        if t >= args.seconds:
            return out
        messages = [{"role": "system", "content": rnd.choice(contexts)},
                    {"role": "user", "content": words(rnd, "q", args.question_words)}]
        out.append((t, {"model": "bench", "messages": messages, "max_tokens": args.max_tokens,
                        "stream": True, "stream_options": {"include_usage": True}}))


class Follower:
    """An index of the engines' events kept in a thread of its own (the gateway's is in its process):
    what the gateway predicts each request finds cached, read as the request is sent."""

    def __init__(self, kv_ports: list[tuple[int, int]]):
        self.kv = KVIndex()
        self.lock = threading.Lock()
        self.names = [f"bench-{i}" for i in range(len(kv_ports))]
        self.predicted: dict[int, int] = {}
        self._ports = kv_ports
        self._ready = threading.Event()
        self._loop = asyncio.new_event_loop()
        self._stop = asyncio.Event()
        self._thread = threading.Thread(target=self._loop.run_until_complete, args=(self._follow(),), daemon=True)
        self._thread.start()
        self._ready.wait()

    async def _follow(self) -> None:
        subs = [Subscription(name, f"tcp://127.0.0.1:{ev}", f"tcp://127.0.0.1:{rp}", "", self._apply, self._drop)
                for name, (ev, rp) in zip(self.names, self._ports, strict=True)]
        for s in subs:
            s.start()
        self._ready.set()
        await self._stop.wait()
        for s in subs:
            await s.close()

    def _apply(self, replica: str, events: list[wire.Event]) -> None:
        with self.lock:
            self.kv.apply(replica, events)

    def _drop(self, replica: str) -> None:
        with self.lock:
            self.kv.drop(replica)

    def predict(self, i: int, body: dict) -> None:
        ids = request_token_ids(body)
        with self.lock:
            keys = self.kv.keys(ids)
            self.predicted[i] = max(self.kv.matches(keys, self.names).values()) * BLOCK if keys else 0

    def close(self) -> None:
        self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(10)


def route_ms(args: argparse.Namespace) -> list[float]:
    """precise-prefix's key and pick per request, in ms, on --route-words prompts an index holds."""
    from llmgw.api import RoutingSpec
    from llmgw.gateway.balancer import Balancer
    from llmgw.gateway.table import Backend

    rnd = random.Random(args.seed)
    docs = [{"model": "bench", "messages": [{"role": "user", "content": words(rnd, f"r{k}w", args.route_words)}]}
            for k in range(64)]
    bal = Balancer()
    policy = bal.policy("bench", RoutingSpec(policy="precise-prefix"))
    kv = bal.kv.index("bench")
    hasher = BlockHasher(BLOCK)
    backends = [Backend(f"bench-{i}", "bench", f"127.0.0.1:{i}") for i in range(args.replicas)]
    for k, doc in enumerate(docs):
        ids = request_token_ids(doc)
        kv.apply(backends[k % len(backends)].replica, [wire.Event("BlockStored", tuple(hasher.keys(ids)), None,
                                                                  tuple(ids), BLOCK)])
    out = []
    for _ in range(5):
        for doc in docs:
            t0 = time.perf_counter()
            policy.pick(backends, bal.inflight, policy.key(doc, None))
            out.append((time.perf_counter() - t0) * 1000)
    return sorted(out)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--replicas", type=int, default=4)
    p.add_argument("--tenants", type=int, default=48)
    p.add_argument("--context-words", type=int, default=1500)
    p.add_argument("--question-words", type=int, default=30)
    p.add_argument("--rate", type=float, default=12.0, help="requests/s")
    p.add_argument("--seconds", type=float, default=20.0)
    p.add_argument("--max-tokens", type=int, default=8)
    p.add_argument("--prefill-ms-per-token", type=float, default=0.2)
    p.add_argument("--decode-ms-per-token", type=float, default=2.0)
    p.add_argument("--max-num-seqs", type=int, default=16)
    p.add_argument("--kv-cache-tokens", type=int, default=16384)
    p.add_argument("--route-words", type=int, default=8192)
    p.add_argument("--seed", type=int, default=46)
    args = p.parse_args()

    llmgw = [str(ROOT / ".venv/bin/llmgw")] if (ROOT / ".venv/bin/llmgw").exists() \
        else [sys.executable, "-m", "llmgw.cli.main"]
    ports = [free_port() for _ in range(args.replicas)]
    kv_ports = [(free_port(), free_port()) for _ in range(args.replicas)]
    schedule = workload(args)
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        engines = []
        try:
            for i, (port, (ev, rp)) in enumerate(zip(ports, kv_ports, strict=True)):
                config = {"enable_kv_cache_events": True, "publisher": "zmq", "endpoint": f"tcp://*:{ev}",
                          "replay_endpoint": f"tcp://*:{rp}"}
                engines.append(subprocess.Popen(
                    [*llmgw, "sim", "--host", "127.0.0.1", "--port", str(port), "--served-model-name", "bench",
                     "--prefill-ms-per-token", str(args.prefill_ms_per_token),
                     "--decode-ms-per-token", str(args.decode_ms_per_token), "--block-size", str(BLOCK),
                     "--max-num-seqs", str(args.max_num_seqs), "--kv-cache-tokens", str(args.kv_cache_tokens),
                     "--kv-events-config", json.dumps(config)],
                    env={**os.environ, "PYTHONHASHSEED": "0"},
                    stdout=subprocess.DEVNULL, stderr=open(Path(tmp, f"sim-{i}.log"), "w")))
            for port, proc in zip(ports, engines, strict=True):
                wait_up(f"http://127.0.0.1:{port}/health", proc)
            follower = Follower(kv_ports)
            try:
                for policy in ("prefix-score", "precise-prefix"):
                    precise = policy == "precise-prefix"
                    r = results[policy] = run_policy(
                        llmgw, tmp, policy, ports, schedule, kv_ports if precise else None,
                        (lambda i: follower.predict(i, schedule[i][1])) if precise else None)
                    r["agreement"] = sum(abs(follower.predicted.get(i, -BLOCK - 1) - c) <= BLOCK
                                         for i, c in r["cached"].items()) / max(1, len(r["cached"]))
                    print(f"{policy:15s} {args.rate:5.1f} req/s  ttft p50 {pct(r['ttft'], .5):7.0f} ms "
                          f"p90 {pct(r['ttft'], .9):7.0f} ms  hit {r['hit_rate']:.2f}  "
                          f"({r['ok']} ok, {r['failures']} failed)", flush=True)
            finally:
                follower.close()
        finally:
            stop(engines)
    routes = route_ms(args)
    approx, precise = results["prefix-score"], results["precise-prefix"]
    print(f"replicas={args.replicas} tenants={args.tenants} context_words={args.context_words} "
          f"cache_tokens={args.kv_cache_tokens} cpus={os.cpu_count()} load average {os.getloadavg()[0]:.1f}")
    print(f"kvrouting: precise_vs_prefix_ttft_p90={pct(approx['ttft'], .9) / pct(precise['ttft'], .9):.2f} "
          f"agreement={precise['agreement']:.2f} hit_rate_precise={precise['hit_rate']:.2f} "
          f"hit_rate_prefix={approx['hit_rate']:.2f} route_ms_p50={routes[len(routes) // 2]:.2f} "
          f"route_ms_p99={routes[int(len(routes) * .99)]:.2f}")


if __name__ == "__main__":
    main()

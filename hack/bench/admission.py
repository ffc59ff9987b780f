#!/usr/bin/env python3
"""What per-key admission adds to a request at the gateway, with 1,000 ApiKeys that all have limits.

    .venv/bin/python hack/bench/admission.py [--keys 1000] [--requests 200000] [--gateway-us 50]

Times, in one process, the work `--watch-api-keys` adds to each request (llmgw/gateway/keyring.py
and admission.py): the bearer key checked against the verified cache (a SHA-256 and a constant-time
compare), the key's scope, its requests, tokens and concurrency limits, its usage counted, its
ticket released. Keys are spread over the requests round-robin, so every key's state is live.
The last line is `admission: cpu_ratio=<(gateway + admission) / gateway>`, the gateway's own CPU
per request taken as --gateway-us (hack/bench/gateway.py measures it: 40-61 us with wrk on the
2-core development machine, 2026-12-04); an estimate from a measured part, not an end-to-end run
(the end-to-end benchmark routes by --static, which takes no ApiKeys). Target: at most 1.15.
"""
from __future__ import annotations

import argparse
import asyncio
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from llmgw.api import ApiKey
from llmgw.api.secrets import hash_secret, new_secret
from llmgw.gateway.admission import Admission, Ticket
from llmgw.gateway.keyring import KeyRing


async def measure(keys: int, requests: int) -> float:
    """Microseconds of admission per request."""
    admission = Admission(lambda model: {"tier": "gold"}, lambda name: name)
    ring = KeyRing(admission.revoke)
    headers = []
    for i in range(keys):
        name = f"key-{i}"
        secret = new_secret(name)
        key = ApiKey.model_validate({
            "kind": "ApiKey", "metadata": {"name": name},
            "spec": {"owner": "bench", "secretHash": hash_secret(secret, n=2), "models": ["llama"],
                     "limits": {"requestsPerMinute": 10**9, "tokensPerMinute": 10**12, "concurrentRequests": 1000}}})
        ring.apply("ADDED", key)
        header = f"Bearer {secret}".encode()
        assert isinstance(await ring.check(header), ApiKey)   # verified once: cached from here on
        headers.append(header)
    start = time.process_time()
    for i in range(requests):
        key = ring.check_now(headers[i % keys])
        assert isinstance(key, ApiKey) and admission.allows(key, "llama")
        ticket = admission.admit(key, "llama", lambda: None)
        assert isinstance(ticket, Ticket)
        ticket.used((40, 20))
        ticket.release()
    return (time.process_time() - start) / requests * 1e6


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--keys", type=int, default=1000)
    p.add_argument("--requests", type=int, default=200_000)
    p.add_argument("--gateway-us", type=float, default=50.0,
                   help="the gateway's CPU per request without keys (hack/bench/gateway.py)")
    args = p.parse_args()
    us = asyncio.run(measure(args.keys, args.requests))
    print(f"keys={args.keys} requests={args.requests}: admission {us:.2f} us per request "
          f"beside the gateway's {args.gateway_us:g} us")
    print(f"admission: cpu_ratio={(args.gateway_us + us) / args.gateway_us:.3f}")


if __name__ == "__main__":
    main()

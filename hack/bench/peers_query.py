"""What a pull's question "which nodes hold or pull these weights?" costs the API server, by fleet size.

A pulling agent asks it before each file (llmgw/weights/peers.py). It used to list every Node
(`GET /nodes`) and pick the peers itself; it now asks `GET /nodes?weights=SOURCE&digest=D`, which
the server answers from its index of the nodes' weights (llmgw/server/weightsindex.py). This
starts etcd and a real `llmgw server`, registers `--nodes` Nodes as hollow agents register them
(llmgw's FakeAgents), gives `--holders` of them the model in their weights cache and as many a
pull of it in flight, then asks each question `--asks` times through the REST client and reports,
per question: the server's CPU (from /proc), the answer's size (as JSON), and the wall time
(the client's decode included).

    .venv/bin/python hack/bench/peers_query.py --nodes 10000 --holders 20

Figures (2-core machine, quiet, 2026-12-05; --holders 20, 20 asks each):

| nodes | list of the fleet: server CPU / size / wall | the index: server CPU / size / wall |
|---|---|---|
| 1,000 | 157-164 ms / 2.29 MB / 231-247 ms | 2.0-2.5 ms / 100 kB / 3.8-4.0 ms |
| 10,000 | 1,943-2,004 ms / 22.8 MB / 2,825-2,860 ms | 2.0-2.5 ms / 100 kB / 4.1 ms |

So a pull of a model of ten files on a 10,000-node fleet cost the server about 20 s of CPU and
the pulling agent 230 MB to decode; it now costs 20 ms and 1 MB, the same as at 1,000 nodes.
The index's own cost is one list of the Nodes at its first question (110 ms of server CPU at
1,000 nodes, 1,230 ms at 10,000) and a decode of each Node event after that, as any watcher of
the Nodes pays.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from controlplane import cpu_seconds  # the script beside this one (hack/bench/)

from llmgw.api import Node
from llmgw.client import Client
from llmgw.dev.apiserver import start_api_server
from llmgw.dev.etcd import etcd_cluster
from llmgw.hollow import FakeAgents
from llmgw.store import Store

SOURCE = "hf://org/model@" + "c" * 40
DIGEST = "sha256:" + "ab" * 32


async def fleet(store: Store, nodes: int, holders: int) -> None:
    agents = await FakeAgents(store, [], workers=32, heartbeat_ttl=600).start()
    names = [f"node-{i:05d}" for i in range(nodes)]
    for i in range(0, nodes, 64):
        await asyncio.gather(*(agents.add_node(n, gpus=8, fabric="fab-a") for n in names[i:i + 64]))
    endpoint = "https://10.0.0.1:9443"
    for i, name in enumerate(names[:2 * holders]):
        weights = ({"models": [{"digest": DIGEST, "sources": [SOURCE]}]} if i < holders else
                   {"pulls": [{"source": SOURCE, "startedAt": "2026-12-05T00:00:00Z"}]})
        await store.patch_status(Node, name, {"agentEndpoint": endpoint, "weights": weights})


async def measure(pid: int, asks: int, ask) -> tuple[float, int, float, float]:
    """Server CPU ms, answer bytes and wall ms per question; and the first question's server CPU
    ms (for the index: its list of the Nodes), which the others do not count."""
    c0 = cpu_seconds(pid)
    size = len(await ask())
    first = (cpu_seconds(pid) - c0) * 1000
    c0, t0 = cpu_seconds(pid), time.perf_counter()
    for _ in range(asks):
        await ask()
    c1, t1 = cpu_seconds(pid), time.perf_counter()
    return (c1 - c0) * 1000 / asks, size, (t1 - t0) * 1000 / asks, first


async def main(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        etcd = etcd_cluster(work / "etcd", size=1).start()
        server = start_api_server(work / "ca", etcd.endpoint, work)
        try:
            store = await Store(etcd.endpoint).connect()
            await fleet(store, args.nodes, args.holders)
            await store.close()
            async with Client(server.url, ca=server.ca, cert=server.admin[0], key=server.admin[1]) as c:
                path = c._path(Node)

                async def listed() -> bytes:
                    return json.dumps(await c.request("GET", path)).encode()

                async def indexed() -> bytes:
                    asked = {"weights": SOURCE, "digest": DIGEST}
                    return json.dumps(await c.request("GET", path, params=asked)).encode()
                lc, lb, lw, _ = await measure(server.proc.pid, args.asks, listed)
                ic, ib, iw, first = await measure(server.proc.pid, args.asks, indexed)
                found = await c.nodes_with_weights(SOURCE, DIGEST)
                assert len(found) == 2 * args.holders, len(found)
        finally:
            server.stop()
            etcd.stop()
    print(f"{args.nodes} nodes, {args.holders} holding and {args.holders} pulling the model; per question:")
    print(f"  list of the fleet: server CPU {lc:.1f} ms, {lb / 1e6:.2f} MB, {lw:.1f} ms")
    print(f"  the index:         server CPU {ic:.1f} ms, {ib / 1e3:.1f} kB, {iw:.1f} ms "
          f"(its first question, which lists the Nodes: {first:.0f} ms of server CPU)")
    print(f"peers_query: nodes={args.nodes} list_cpu_ms={lc:.1f} list_bytes={lb} index_cpu_ms={ic:.2f} "
          f"index_bytes={ib}")


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--nodes", type=int, default=1000)
    p.add_argument("--holders", type=int, default=20)
    p.add_argument("--asks", type=int, default=20)
    asyncio.run(main(p.parse_args()))

#!/usr/bin/env python3
"""How long `llmgw` takes to start and finish, as an operator's loop or script sees it.

    .venv/bin/python hack/bench/cli.py [--runs 10]

Starts a real etcd, a CA and `llmgw server` on loopback (llmgw/dev/apiserver.py's, as the
other benches do), writes an admin client config with `llmgw ca issue admin --write-config`,
then runs each command --runs times as a fresh process (the `llmgw` script next to this
Python), one after another, after one run not counted (it writes the bytecode that an installed
llmgw has, whatever PYTHONDONTWRITEBYTECODE says here):

    llmgw version
    llmgw get nodes              (one node registered, so the table has a row)
    llmgw apply -f model.yaml    (one small Model; after the first run it is 'unchanged')
    python -c pass               (the floor: the interpreter's own start)

and prints each command's median wall time; the last line is

    cli: version_s=<median> get_s=<median> apply_s=<median> floor_s=<median>

Target (issue 35): version, get and apply each within 0.3 s.

On the 2-core development machine, shared with 7 other sessions (load average 1-2), 2026-12-05,
three runs of the benchmark each:
    before (every verb imported apply, get, describe and nodes; rich, and pydantic's schemas of
    every kind, at import; the interpreter's exit walking every object):
        cli: version_s=0.243-0.259 get_s=0.371-0.408 apply_s=0.383-0.389 floor_s=0.021-0.023
    each verb imported alone; rich only on a terminal; pydantic schemas built on first use
    (defer_build), the stored-object adapter of every kind too; objects frozen before the exit:
        cli: version_s=0.060-0.063 get_s=0.305-0.313 apply_s=0.308-0.320 floor_s=0.023
    and the verbs' requests through http.client (llmgw/client/oneshot.py), not aiohttp (~100 ms
    to import, ~40 ms of it the two default SSL contexts it makes at import and llmgw never uses):
        cli: version_s=0.061-0.062 get_s=0.215-0.225 apply_s=0.214-0.228 floor_s=0.022-0.023
What get and apply still import (python -X importtime): pydantic and llmgw.api ~110 ms (~20 ms
of it pydantic's plugin look-up through importlib.metadata), asyncio ~24 ms, click ~18 ms, yaml
~10 ms; the run itself ~30 ms (TLS, two requests for get nodes, the Node and Replica schemas).
"""
from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from llmgw.client import Client
from llmgw.dev.apiserver import start_api_server
from llmgw.dev.etcd import etcd_cluster
from llmgw.hollow import make_node

MODEL = """\
apiVersion: llmgw.io/v1
kind: Model
metadata:
  name: bench-cli
spec:
  replicas: 0
  profiles:
  - engine: sim
"""


def timed(argv: list[str], env: dict[str, str], runs: int) -> float:
    """The median wall time of `argv` over `runs` runs, after one run not counted; every run must exit 0."""
    times = []
    for _ in range(runs + 1):
        t0 = time.perf_counter()
        proc = subprocess.run(argv, env=env, capture_output=True, text=True)
        times.append(time.perf_counter() - t0)
        if proc.returncode != 0:
            raise SystemExit(f"{' '.join(argv)} exited {proc.returncode}:\n{proc.stdout}{proc.stderr}")
    return statistics.median(times[1:])


async def register_node(server, name: str) -> None:
    async with Client(server.url, ca=server.ca, cert=server.admin[0], key=server.admin[1]) as c:
        created = await c.create(make_node(name, 1))
        await c.update_status(created.model_copy(update={"status": make_node(name, 1).status}))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=10)
    args = ap.parse_args()
    llmgw = str(Path(sys.executable).parent / "llmgw")
    with tempfile.TemporaryDirectory(prefix="llmgw-bench-cli-") as tmp:
        base = Path(tmp)
        etcd = etcd_cluster(base / "etcd", size=1).start()
        server = start_api_server(base / "ca", etcd.endpoint, base)
        try:
            config = base / "config.yaml"
            subprocess.run([llmgw, "ca", "issue", "admin", "bench", "--dir", str(server.ca_dir), "--write-config",
                            "--server", server.url, "--config", str(config)], check=True, stdout=subprocess.DEVNULL)
            asyncio.run(register_node(server, "bench-node"))
            manifest = base / "model.yaml"
            manifest.write_text(MODEL)
            # Bytecode written as an installed llmgw has it (pip compiles on install): with
            # PYTHONDONTWRITEBYTECODE every run would compile llmgw's modules again (~25 ms).
            env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
            env["LLMGW_CONFIG"] = str(config)
            figures = {
                "version_s": timed([llmgw, "version"], env, args.runs),
                "get_s": timed([llmgw, "get", "nodes"], env, args.runs),
                "apply_s": timed([llmgw, "apply", "-f", str(manifest)], env, args.runs),
                "floor_s": timed([sys.executable, "-c", "pass"], env, args.runs),
            }
        finally:
            server.stop()
            etcd.stop()
    print("cli: " + " ".join(f"{k}={v:.3f}" for k, v in figures.items()))


if __name__ == "__main__":
    main()

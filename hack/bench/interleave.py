#!/usr/bin/env python3
"""Run one benchmark on two checkouts in interleaved order, to compare a change with its base.

    git worktree add /tmp/base <commit> && (cd /tmp/base && python3 -m venv .venv &&
        .venv/bin/pip install -q -e '.[test]')
    .venv/bin/python hack/bench/interleave.py --base /tmp/base [--rounds 2] -- hack/bench/store.py --n 1000

Each round runs the benchmark in the base checkout and in this one (or --head DIR), each
with its own .venv/bin/python and its own directory as the working directory, in ABBA
order (base, head, head, base, then again): on a shared machine whatever else runs
then falls on both sides alike, where one side after the other mostly measures the
time of day. Every benchmark in hack/bench/ ends with a line of `key=value` figures;
this prints each run's last line, then the median of each figure per side and
head/base. Its last line: `interleave: <key>=<head/base> ...`.

A run that fails stops the comparison with its output's tail.

Issue 23's redesign (typed spine, store split, one reflector) against its base 426ff16, on the
2-core development machine with nothing else running, 2026-12-04 (per-run last lines, ABBA):
    controlplane.py --nodes 1000 --replicas 2200   binds/s  before 1002 1153          after 1044 1030
    store.py --n 1000                               ratio    before 0.05 0.05          after 0.20 0.24
        (Model creates no longer decode every stored Model's spec)
    api.py --ops 200 --watchers 200 --writes 3      ratio    before 0.34 0.31          after 0.33 0.35
    gateway.py --seconds 4, --rounds 2   throughput_ratio    before 1.09 1.14 1.15 1.19  after 1.11 1.00 1.17 1.21
    interleave: binds/s=0.962 (controlplane)  ratio=4.400 (store)  throughput_ratio=0.996 (gateway)

Issue 29's second step (one error contract, engines and routing policies as registered modules,
the server's pipeline, strict typing, the store's names concern and per-term controllers)
against the session's base 0a11f6e, 2026-12-05 (ABBA):
    gateway.py --seconds 4, --rounds 2   throughput_ratio    before 1.11 1.03 1.13 1.14  after 1.12 1.16 1.12 0.87
    controlplane.py --nodes 300 --replicas 660, --rounds 1   binds/s   before 1142 1351   after 1298 1254
    interleave: throughput_ratio=1.000 added_p50_ms=0.958 (gateway)  binds/s=1.024 (controlplane)
    (routing.py's selection per request, old/new x3: least-outstanding 0.64-0.66 -> 0.70-0.72 us,
    prefix-hash 3.83-4.08 -> 4.00-4.15 us, prefix-score 8.96-9.18 -> 8.79-9.04 us)
"""
from __future__ import annotations

import argparse
import re
import statistics
import subprocess
import sys
from pathlib import Path

FIGURE = re.compile(r"([A-Za-z_][\w/]*)=(-?[0-9.]+(?:e-?\d+)?)")


def run(checkout: Path, bench: list[str]) -> dict[str, float]:
    proc = subprocess.run([str(checkout / ".venv/bin/python"), *bench], cwd=checkout,
                          capture_output=True, text=True)
    lines = proc.stdout.strip().splitlines()
    if proc.returncode != 0 or not lines:
        tail = "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-15:])
        sys.exit(f"interleave: {' '.join(bench)} failed in {checkout} (exit {proc.returncode}):\n{tail}")
    print(f"  {checkout}: {lines[-1]}", flush=True)
    return {key: float(value) for key, value in FIGURE.findall(lines[-1])}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--base", type=Path, required=True, help="checkout of the base (with its own .venv)")
    parser.add_argument("--head", type=Path, default=Path(__file__).resolve().parents[2],
                        help="checkout of the change (default: this one)")
    parser.add_argument("--rounds", type=int, default=2, help="ABBA rounds (each runs both sides twice)")
    parser.add_argument("bench", nargs=argparse.REMAINDER, help="-- the benchmark script and its arguments")
    args = parser.parse_args()
    bench = args.bench[1:] if args.bench[:1] == ["--"] else args.bench
    if not bench:
        parser.error("name the benchmark after --")
    figures: dict[str, list[dict[str, float]]] = {"base": [], "head": []}
    for i in range(args.rounds):
        print(f"round {i + 1}/{args.rounds}", flush=True)
        for side in ("base", "head", "head", "base"):
            figures[side].append(run(args.base if side == "base" else args.head, bench))
    ratios = []
    for key in figures["head"][0]:
        if not any(key in f for f in figures["base"]):  # a figure the change added
            print(f"{key}: head median {statistics.median(f[key] for f in figures['head'] if key in f):g}, "
                  f"not in the base's")
            continue
        base = statistics.median(f[key] for f in figures["base"] if key in f)
        head = statistics.median(f[key] for f in figures["head"] if key in f)
        print(f"{key}: base median {base:g}, head median {head:g}")
        if base:
            ratios.append(f"{key}={head / base:.3f}")
    print("interleave: " + " ".join(ratios))


if __name__ == "__main__":
    main()

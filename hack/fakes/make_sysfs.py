#!/usr/bin/env python3
"""Write a fake InfiniBand sysfs tree (the shape of /sys/class/infiniband).

From Python:
    from make_sysfs import FakePort, make_sysfs
    make_sysfs(root, [FakePort("mlx5_0"), FakePort("mlx5_1", state="DOWN")])

From the shell (one SPEC per port):
    make_sysfs.py ROOT mlx5_0 mlx5_1:DOWN mlx5_2:ACTIVE:Ethernet:100 mlx5_3/2:ACTIVE:InfiniBand:200

SPEC is ADAPTER[/PORT][:STATE[:LINK_LAYER[:RATE_GBPS]]]; defaults: port 1,
ACTIVE, InfiniBand, 400. Then point the agent at it: `llmgw agent --ib-root ROOT`.
"""
from __future__ import annotations

import argparse
import os
from dataclasses import dataclass
from pathlib import Path

# The kernel's numeric codes (drivers/infiniband/core/sysfs.c).
STATE_CODES = {"NOP": 0, "DOWN": 1, "INIT": 2, "ARMED": 3, "ACTIVE": 4, "ACTIVE_DEFER": 5}
PHYS_STATE = {"DOWN": "3: Disabled", "INIT": "5: LinkUp", "ARMED": "5: LinkUp",
              "ACTIVE": "5: LinkUp", "ACTIVE_DEFER": "5: LinkUp", "NOP": "0: <unknown>"}
RATE_NAMES = {400: "4X NDR", 200: "4X HDR", 100: "4X EDR", 56: "4X FDR", 25: "1X EDR", 10: "4X SDR"}


@dataclass
class FakePort:
    adapter: str
    port: int = 1
    state: str = "ACTIVE"
    link_layer: str = "InfiniBand"
    rate_gbps: int = 400


def parse_spec(spec: str) -> FakePort:
    head, *rest = spec.split(":")
    adapter, _, port = head.partition("/")
    fields = {"adapter": adapter, "port": int(port) if port else 1}
    for key, value in zip(("state", "link_layer", "rate_gbps"), rest, strict=False):
        fields[key] = int(value) if key == "rate_gbps" else value
    return FakePort(**fields)


def make_sysfs(root: str | os.PathLike, ports: list[FakePort]) -> Path:
    """Create (or add to) a sysfs-shaped tree under `root`; returns root."""
    root = Path(root)
    for n, p in enumerate(ports):
        if p.state not in STATE_CODES:
            raise ValueError(f"unknown port state {p.state!r}: use one of {', '.join(STATE_CODES)}")
        dev = root / p.adapter
        pdir = dev / "ports" / str(p.port)
        (pdir / "gids").mkdir(parents=True, exist_ok=True)
        guid = f"0c42:a103:00{n:02x}:d6b6"
        _write(dev / "node_guid", guid)
        _write(dev / "node_type", "1: CA")
        _write(pdir / "state", f"{STATE_CODES[p.state]}: {p.state}")
        _write(pdir / "phys_state", PHYS_STATE[p.state])
        _write(pdir / "link_layer", p.link_layer)
        _write(pdir / "rate", f"{p.rate_gbps} Gb/sec ({RATE_NAMES.get(p.rate_gbps, '4X')})")
        _write(pdir / "lid", f"0x{0x12 + n:x}")
        _write(pdir / "sm_lid", "0x1")
        _write(pdir / "gids" / "0", "fe80:0000:0000:0000:" + guid)
    return root


def _write(path: Path, text: str) -> None:
    path.write_text(text + "\n")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("root", help="directory to create the tree in")
    parser.add_argument("specs", nargs="+", metavar="SPEC",
                        help="ADAPTER[/PORT][:STATE[:LINK_LAYER[:RATE_GBPS]]]")
    args = parser.parse_args(argv)
    try:
        ports = [parse_spec(s) for s in args.specs]
        make_sysfs(args.root, ports)
    except ValueError as err:
        parser.error(str(err))
    for p in ports:
        print(f"{args.root}/{p.adapter}/ports/{p.port}: {p.state} {p.link_layer} {p.rate_gbps} Gb/sec")


if __name__ == "__main__":
    main()

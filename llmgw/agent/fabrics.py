"""Fabrics: which of the node's InfiniBand ports belong to which named fabric.

`--fabric ib-a` claims the first two ACTIVE InfiniBand ports that no other
fabric names, in adapter-name order; `--fabric ib-b:mlx5_2,mlx5_3` names its
adapters (an item may give the port as NCCL does: `mlx5_2:1`; without it, port
1 or the adapter's lowest port). No fabric: the node is an island.

Mistakes are refused before the agent starts (FabricError): an adapter under
two fabrics, a named adapter that does not exist, a fabric that cannot get
its adapters, a fabric named twice.
"""
from __future__ import annotations

from dataclasses import dataclass

from llmgw.agent.discovery.infiniband import Port
from llmgw.api import Fabric
from llmgw.api.fabrics import DEFAULT_ADAPTERS_PER_FABRIC, FabricError, FabricSpec


@dataclass
class Assignment:
    fabrics: list[Fabric]
    warnings: list[str]

    def adapters(self, fabric: str) -> list[tuple[str, int]]:
        for f in self.fabrics:
            if f.name == fabric:
                return [(a.name, a.port) for a in f.adapters]
        raise KeyError(fabric)


def assign_fabrics(specs: list[FabricSpec], ports: list[Port], ib_root: str,
                   per_fabric: int = DEFAULT_ADAPTERS_PER_FABRIC) -> Assignment:
    seen: set[str] = set()
    for s in specs:
        if s.name in seen:
            raise FabricError(f"fabric {s.name} is given twice; give each fabric once")
        seen.add(s.name)

    by_key = {(p.adapter, p.port): p for p in ports}
    owner: dict[tuple[str, int], str] = {}
    chosen: dict[str, list[Port]] = {}
    warnings: list[str] = []

    # Named adapters first: they are off limits to automatic claims, wherever they appear.
    for s in specs:
        if s.adapters is None:
            continue
        chosen[s.name] = []
        for item in s.adapters:
            port = _resolve(item, s.name, ports, by_key, ib_root)
            key = (port.adapter, port.port)
            if key in owner:
                other = owner[key]
                where = (f"twice under fabric {s.name}" if other == s.name
                         else f"under two fabrics: {other} and {s.name}")
                raise FabricError(f"adapter {port.adapter} port {port.port} appears {where}; "
                                  "an adapter belongs to one fabric")
            owner[key] = s.name
            chosen[s.name].append(port)
            if port.state != "ACTIVE":
                warnings.append(f"fabric {s.name}: {port.describe()} is not ACTIVE")

    for s in specs:
        if s.adapters is not None:
            continue
        free = [p for p in ports if p.usable and (p.adapter, p.port) not in owner]
        if len(free) < per_fabric:
            raise FabricError(_shortfall(s.name, per_fabric, free, ports, owner, ib_root))
        chosen[s.name] = free[:per_fabric]
        for p in chosen[s.name]:
            owner[(p.adapter, p.port)] = s.name

    fabrics = [Fabric(name=s.name, adapters=[p.to_api() for p in chosen[s.name]]) for s in specs]
    return Assignment(fabrics=fabrics, warnings=warnings)


def _resolve(item: str, fabric: str, ports: list[Port], by_key: dict[tuple[str, int], Port], ib_root: str) -> Port:
    adapter, sep, port_text = item.partition(":")
    mine = [p for p in ports if p.adapter == adapter]
    if not mine:
        found = ", ".join(sorted({p.adapter for p in ports})) or "none"
        raise FabricError(f"fabric {fabric}: adapter {adapter} not found under {ib_root} "
                          f"(adapters there: {found})")
    if sep:
        if not port_text.isdigit() or (adapter, int(port_text)) not in by_key:
            have = ", ".join(str(p.port) for p in mine)
            raise FabricError(f"fabric {fabric}: adapter {adapter} has no port {port_text!r} under "
                              f"{ib_root}/{adapter}/ports (ports: {have})")
        return by_key[(adapter, int(port_text))]
    return by_key.get((adapter, 1)) or mine[0]


def _shortfall(name: str, need: int, free: list[Port], ports: list[Port],
               owner: dict[tuple[str, int], str], ib_root: str) -> str:
    msg = (f"fabric {name} needs {need} ACTIVE InfiniBand ports that no other fabric names, "
           f"but {ib_root} has {len(free)}")
    if free:
        msg += ": " + ", ".join(p.describe() for p in free)
    if not ports:
        return msg + " (no adapters there; is this the right --ib-root?)"
    claimed = [f"{p.adapter} port {p.port} (fabric {owner[(p.adapter, p.port)]})"
               for p in ports if (p.adapter, p.port) in owner]
    unusable = [p.describe() for p in ports if not p.usable and (p.adapter, p.port) not in owner]
    if claimed:
        msg += "; taken: " + ", ".join(claimed)
    if unusable:
        msg += "; not usable: " + ", ".join(unusable)
    return msg + f". Name the adapters ({name}:ADAPTER,ADAPTER) or bring ports up."

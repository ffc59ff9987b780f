"""The fabrics a node declares (the agent's `--fabric` and `fabrics:`, `llmgw-onboard-node --fabric`).

`ib-a` claims DEFAULT_ADAPTERS_PER_FABRIC ports automatically; `ib-b:mlx5_2,mlx5_3`
names its adapters (an item may give the port as NCCL does: `mlx5_2:1`). Which
ports a spec gets on a machine is the agent's business (llmgw/agent/fabrics.py).
"""
from __future__ import annotations

from dataclasses import dataclass

from llmgw.api.meta import check_dns1123_label

DEFAULT_ADAPTERS_PER_FABRIC = 2


class FabricError(Exception):
    pass


@dataclass(frozen=True)
class FabricSpec:
    name: str
    adapters: tuple[str, ...] | None = None   # None: claim DEFAULT_ADAPTERS_PER_FABRIC automatically

    @classmethod
    def parse(cls, text: str) -> "FabricSpec":
        """'ib-a' or 'ib-b:mlx5_2,mlx5_3' (items may be 'mlx5_2:1')."""
        name, sep, rest = text.strip().partition(":")
        try:
            check_dns1123_label(name)
        except ValueError as err:
            raise FabricError(f"--fabric {text!r}: fabric name {err}") from None
        if not sep:
            return cls(name)
        items = tuple(i.strip() for i in rest.split(",") if i.strip())
        if not items:
            raise FabricError(f"--fabric {text!r}: no adapters after ':' (write {name} to claim "
                              f"{DEFAULT_ADAPTERS_PER_FABRIC} automatically, or {name}:mlx5_0,mlx5_1)")
        return cls(name, items)

    def __str__(self) -> str:
        return self.name + (":" + ",".join(self.adapters) if self.adapters else "")

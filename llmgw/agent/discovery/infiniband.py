"""InfiniBand (and RoCE) port discovery from sysfs: /sys/class/infiniband/<adapter>/ports/<n>/.

Nothing in sysfs names the fabric a port is cabled to (OpenSM's default GID
prefix and LIDs repeat across fabrics): the operator names fabrics with
--fabric, see llmgw.agent.fabrics.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from llmgw.api import Adapter

DEFAULT_IB_ROOT = "/sys/class/infiniband"


@dataclass(frozen=True)
class Port:
    adapter: str
    port: int
    state: str          # DOWN, INIT, ARMED, ACTIVE, ACTIVE_DEFER ("" if unreadable)
    link_layer: str     # InfiniBand, or Ethernet for RoCE
    rate: str           # e.g. "400 Gb/sec (4X NDR)"

    @property
    def usable(self) -> bool:
        """Can carry an InfiniBand fabric now: ACTIVE and InfiniBand link layer."""
        return self.state == "ACTIVE" and self.link_layer == "InfiniBand"

    def describe(self) -> str:
        return (f"{self.adapter} port {self.port} "
                f"({self.state or 'state unknown'}, {self.link_layer or 'link layer unknown'})")

    def to_api(self) -> Adapter:
        return Adapter(name=self.adapter, port=self.port, state=self.state,
                       linkLayer=self.link_layer, rate=self.rate)


class IBDiscoveryError(Exception):
    pass


def discover_ports(root: str = DEFAULT_IB_ROOT) -> list[Port]:
    """Every port of every adapter under root, in adapter-name then port order.

    A missing root means no InfiniBand adapters (an empty list). A root that
    exists but cannot be read raises IBDiscoveryError naming the path.
    """
    base = Path(root)
    if not base.exists():
        return []
    try:
        adapters = sorted(p for p in base.iterdir() if (p / "ports").is_dir())
    except OSError as err:
        raise IBDiscoveryError(f"cannot read InfiniBand adapters under {root}: {err.strerror or err}") from None
    ports: list[Port] = []
    for dev in adapters:
        for pdir in sorted((dev / "ports").iterdir(), key=lambda p: _port_number(p.name)):
            number = _port_number(pdir.name)
            if number < 0:
                continue
            ports.append(Port(
                adapter=dev.name, port=number,
                state=_state(_read(pdir / "state")),
                link_layer=_read(pdir / "link_layer"),
                rate=_read(pdir / "rate"),
            ))
    return ports


def _port_number(name: str) -> int:
    return int(name) if name.isascii() and name.isdigit() else -1


def _read(path: Path) -> str:
    try:
        return path.read_text(errors="replace").strip()  # a driver's odd bytes are not fatal
    except OSError:
        return ""


def _state(raw: str) -> str:
    """'4: ACTIVE' -> 'ACTIVE'."""
    return raw.split(":", 1)[1].strip() if ":" in raw else raw

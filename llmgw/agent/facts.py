"""Everything the agent knows about its node, gathered in one pass, and the NodeStatus it makes.

`gather(config)` runs discovery (GPUs, InfiniBand ports, fabrics, engines);
fabric mistakes raise FabricError, so the agent refuses to start. GPU
discovery failures do not: they become GPUDiscovery=False on the Node.
"""
from __future__ import annotations

import ipaddress
import socket
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from llmgw.agent.config import AgentConfig
from llmgw.agent.discovery.gpu import GPUReport, discover_gpus
from llmgw.agent.discovery.infiniband import IBDiscoveryError, Port, discover_ports
from llmgw.agent.fabrics import Assignment, assign_fabrics
from llmgw.agent.inventory import Inventory, take_inventory
from llmgw.api import GPU, Condition, NodeStatus, set_condition
from llmgw.api.fabrics import FabricError
from llmgw.version import version


@dataclass
class Facts:
    address: str
    gpu: GPUReport
    ports: list[Port]
    fabrics: Assignment
    inventory: Inventory
    warnings: list[str] = field(default_factory=list)


def gather(config: AgentConfig) -> Facts:
    try:
        ports = discover_ports(config.ib_root)
    except IBDiscoveryError as err:
        if config.fabrics:
            raise FabricError(str(err)) from None
        ports = []
    fabrics = assign_fabrics(config.fabrics, ports, config.ib_root)
    gpu = discover_gpus(config.nvidia_smi, timeout=config.nvidia_smi_timeout)
    inventory = take_inventory(config.engines)
    return Facts(address=advertise_address(config), gpu=gpu, ports=ports, fabrics=fabrics,
                      inventory=inventory, warnings=list(fabrics.warnings))


def settle_free(gpus: list[GPU], reported: dict[int, int], step: int) -> list[GPU]:
    """`gpus` with each free memory figure that moved less than `step` MiB from the one `reported`
    (GPU index -> MiB) put back to that one: the Node is written when a GPU's free memory changes by
    a step, not at every allocation of a running engine."""
    out = []
    for g in gpus:
        was = reported.get(g.index)
        if was is not None and g.memoryFreeMiB is not None and abs(g.memoryFreeMiB - was) < step:
            g = g.model_copy(update={"memoryFreeMiB": was})
        out.append(g)
    return out


def advertise_address(config: AgentConfig) -> str:
    """--advertise-address, else the local address the kernel would use to reach the server."""
    if config.advertise_address:
        return config.advertise_address
    host = urlsplit(config.server_url).hostname if config.server else None
    if host:
        try:
            family = socket.AF_INET6 if ipaddress.ip_address(host).version == 6 else socket.AF_INET
        except ValueError:
            family = socket.AF_INET
        try:
            with socket.socket(family, socket.SOCK_DGRAM) as s:
                s.connect((host, 9))        # UDP connect sends nothing; it picks the route
                address: str = s.getsockname()[0]
                return address
        except OSError:
            pass
    try:
        return socket.gethostbyname(socket.gethostname())
    except OSError:
        return "127.0.0.1"


def node_status(facts: Facts, config: AgentConfig,
                conditions: list[Condition] | None = None) -> NodeStatus:
    """The status the agent reports for its Node (conditions merged into `conditions`)."""
    conds = [c.model_copy() for c in (conditions or [])]
    gpu = facts.gpu
    if gpu.ok:
        set_condition(conds, "GPUDiscovery", "True", "Discovered",
                      f"{len(gpu.gpus)} GPUs found by {gpu.path}")
    else:
        set_condition(conds, "GPUDiscovery", "False", "DiscoveryFailed", gpu.error or "")
    inv = facts.inventory
    found = ", ".join(f"{e.name} ({e.path})" for e in inv.engines)
    if inv.problems:
        set_condition(conds, "EnginesFound", "False", "ExecutableMissing",
                      "; ".join(inv.problems) + f". Found: {found}")
    else:
        set_condition(conds, "EnginesFound", "True", "Found", found)
    return NodeStatus(
        addresses=[facts.address],
        gpus=gpu.gpus,
        driverVersion=gpu.driver_version,
        fabrics=facts.fabrics.fabrics,
        engines=inv.engines,
        portRange=config.port_range,
        conditions=conds,
        agentVersion=version(),
    )

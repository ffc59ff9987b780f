"""Each node of a local cluster in a network namespace of its own, and nftables rules in it
(the fault-injection tests' clusters, and `llmgw dev up --netns`).

    net = Network.create(["n1", "n2"])    # Unavailable (a reason) where namespaces cannot be made
    net.address("n1")                     # 10.X.Y.1: the node's address, on its namespace's eth0
    net.exec_prefix("n1")                 # ["ip", "netns", "exec", ...]: run a command inside it
    net.rules("n1", ['iifname "eth0" tcp dport 10000 drop'], ['oifname "eth0" tcp sport 10000 drop'])
    net.heal("n1")                        # its rules gone
    net.remove()                          # namespaces, veth pairs and the bridge gone
    net.save(path); remove_saved(path)    # what `llmgw dev down` removes after a `dev up` that died

Layout: a bridge in the host's namespace holds 10.X.Y.254/24 (a /24 picked at random from
10.200.0.0-10.249.255.0, one no route of the host covers); each node's namespace has its end of a
veth pair as eth0 with 10.X.Y.N/24 and no route beyond the /24, so its traffic reaches only the
host's bridge address and the other nodes. The control plane and the gateway run in the host's
namespace: they reach a node only over its veth, so a partition is a rule on the node's eth0 and
nothing else changes. Every rule lives in one nftables table inside the node's namespace
(`inet llmgw_nemesis`), gone with its namespace.

Names carry the /24 (bridge lgw<X>-<Y>, veth lgw<X>-<Y>-<i>, namespace lgw<X>-<Y>-<node>): the
bridge's creation is the lock on the /24, so two clusters on one machine never share one.
"""
from __future__ import annotations

import json
import random
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

TABLE = "llmgw_nemesis"
HOST = 254          # the bridge's address in the /24


class Unavailable(RuntimeError):
    """Network namespaces (or a bridge, or a veth pair) cannot be made here; the reason says why."""


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(["ip", *args], capture_output=True, text=True)
    if check and done.returncode:
        raise Unavailable(f"`ip {' '.join(args)}` failed: {done.stderr.strip()}")
    return done


@dataclass
class Network:
    prefix: str                                                # "10.X.Y"
    bridge: str
    netns: dict[str, str] = field(default_factory=dict)        # node -> its namespace
    addresses: dict[str, str] = field(default_factory=dict)    # node -> its address

    @property
    def host(self) -> str:
        """The host's address on the bridge: where the nodes reach the control plane."""
        return f"{self.prefix}.{HOST}"

    @classmethod
    def create(cls, nodes: list[str], tries: int = 20) -> "Network":
        if shutil.which("ip") is None:
            raise Unavailable("`ip` (iproute2) is not installed")
        taken = _ip("-4", "route", "show", "table", "all").stdout
        for _ in range(tries):
            x, y = random.randrange(200, 250), random.randrange(256)
            prefix, bridge = f"10.{x}.{y}", f"lgw{x}-{y}"
            if f"{prefix}." in taken:
                continue
            made = _ip("link", "add", "name", bridge, "type", "bridge", check=False)
            if made.returncode == 0:
                break
            if "exists" not in made.stderr:
                raise Unavailable(f"cannot make a bridge: {made.stderr.strip()}")
        else:
            raise Unavailable(f"no free /24 in 10.200-249.x after {tries} tries")
        net = cls(prefix, bridge)
        try:
            _ip("addr", "add", f"{net.host}/24", "dev", bridge)
            _ip("link", "set", bridge, "up")
            for i, node in enumerate(nodes):
                net._add_node(i, node)
        except BaseException:
            net.remove()
            raise
        return net

    def _add_node(self, i: int, node: str) -> None:
        ns, veth = f"{self.bridge}-{node}", f"{self.bridge}-{i}"
        _ip("netns", "add", ns)
        self.netns[node] = ns
        _ip("link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", ns)
        _ip("link", "set", veth, "master", self.bridge, "up")
        self.addresses[node] = f"{self.prefix}.{i + 1}"
        _ip("-n", ns, "addr", "add", f"{self.addresses[node]}/24", "dev", "eth0")
        _ip("-n", ns, "link", "set", "eth0", "up")
        _ip("-n", ns, "link", "set", "lo", "up")

    def address(self, node: str) -> str:
        return self.addresses[node]

    def exec_prefix(self, node: str) -> list[str]:
        return ["ip", "netns", "exec", self.netns[node]]

    def remove(self) -> None:
        """Every namespace (its veth end, so the pair, and its rules with it), then the bridge."""
        for ns in self.netns.values():
            _ip("netns", "del", ns, check=False)
        _ip("link", "del", self.bridge, check=False)

    def save(self, path: Path) -> None:
        path.write_text(json.dumps({"bridge": self.bridge, "netns": sorted(self.netns.values())}))

    # ------------------------------------------------------------ nftables
    def rules(self, node: str, inbound: list[str], outbound: list[str]) -> None:
        """Add rules (nft rule statements) to the node's input and output chains."""
        script = [f"table inet {TABLE} {{",
                  "  chain input { type filter hook input priority 0; policy accept; }",
                  "  chain output { type filter hook output priority 0; policy accept; }",
                  "}"]
        script += [f"add rule inet {TABLE} input {r}" for r in inbound]
        script += [f"add rule inet {TABLE} output {r}" for r in outbound]
        self._nft(node, "\n".join(script))

    def heal(self, node: str) -> None:
        """Every rule of the node gone (adding the table first makes deleting it never fail)."""
        self._nft(node, f"add table inet {TABLE}\ndelete table inet {TABLE}")

    def _nft(self, node: str, script: str) -> None:
        if shutil.which("nft") is None:
            raise Unavailable("`nft` (Debian's nftables) is not installed")
        done = subprocess.run([*self.exec_prefix(node), "nft", "-f", "-"], input=script,
                              capture_output=True, text=True)
        if done.returncode:
            raise RuntimeError(f"nft in {self.netns[node]} failed: {done.stderr.strip()}\n{script}")


def remove_saved(path: Path) -> bool:
    """Remove the namespaces and the bridge a `save` wrote down (those still there), and the file;
    False when there was no such file."""
    if not path.exists():
        return False
    saved = json.loads(path.read_text())
    for ns in saved["netns"]:
        _ip("netns", "del", ns, check=False)
    _ip("link", "del", saved["bridge"], check=False)
    path.unlink()
    return True

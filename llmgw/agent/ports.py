"""Who holds a TCP port on this node: bound sockets from /proc/net/tcp{,6}, owners from /proc/PID/fd.

    held = holders(range(30000, 32768), ours=[engine pgids], address="10.0.0.5")
    foreign(held)                   # the holders that are not ours

A socket is "held" when it listens (state 0A) or is bound without being
connected (state 07) on the engines' bind address or on a wildcard address
(0.0.0.0, ::): either makes an engine's bind() of that address and port
fail, and either could answer a probe sent there. Its owner is found by the
socket's inode among the open files of processes:
first among the members of our engines' process groups (cheap, and enough
when nothing foreign is there), then among every process, to name a
stranger. A socket whose owner cannot be seen (another user's process, when
the agent is not root) counts as foreign with an unknown pid.
"""
from __future__ import annotations

import ipaddress
import os
from dataclasses import dataclass
from typing import Container, Iterable

from llmgw.agent import process

NET_TABLES = ("/proc/net/tcp", "/proc/net/tcp6")
_HELD_STATES = {"0A", "07"}     # LISTEN, CLOSE (bound, not connected)


@dataclass(frozen=True)
class Holder:
    port: int
    pid: int | None      # None: the socket's owner is not visible to the agent
    command: str         # the owner's command line, shortened ("" when unknown)
    ours: bool           # a member of one of this node's engines' process groups

    def describe(self) -> str:
        if self.pid is None:
            return f"port {self.port} held by a process the agent cannot see (pid unknown)"
        return f"port {self.port} held by pid {self.pid} ({self.command})"


def _local_address(hex_addr: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address:
    """/proc/net/tcp's address: 32-bit words in host (little-endian) order."""
    raw = bytes.fromhex(hex_addr)
    data = b"".join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4))
    addr = ipaddress.ip_address(data)
    return addr.ipv4_mapped or addr if addr.version == 6 else addr


def _bind_address(address: str | None) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    """The engines' bind address; None (every address counts) for none, a wildcard or a name."""
    try:
        addr = ipaddress.ip_address(address) if address else None
    except ValueError:
        return None
    return None if addr is None or addr.is_unspecified else addr


def bound_sockets(ports: Container[int], address: str | None = None) -> dict[int, set[int]]:
    """Inodes of the sockets holding each of `ports` on `address` (None: any address); only
    ports held appear."""
    out: dict[int, set[int]] = {}
    mine = _bind_address(address)
    for table in NET_TABLES:
        try:
            with open(table) as f:
                lines = f.read().splitlines()[1:]
        except OSError:
            continue            # no IPv6 on this host
        for line in lines:
            fields = line.split()
            if len(fields) < 10 or fields[3] not in _HELD_STATES:
                continue
            hex_addr, hex_port = fields[1].rsplit(":", 1)
            port, inode = int(hex_port, 16), int(fields[9])
            if not inode or port not in ports:
                continue
            local = _local_address(hex_addr)
            if mine is None or local.is_unspecified or local == mine:
                out.setdefault(port, set()).add(inode)
    return out


def socket_owners(inodes: set[int], pids: Iterable[int]) -> dict[int, int]:
    """inode -> pid for the sockets among `inodes` that one of `pids` has open."""
    found: dict[int, int] = {}
    for pid in pids:
        if len(found) == len(inodes):
            break
        fd_dir = f"/proc/{pid}/fd"
        try:
            fds = os.listdir(fd_dir)
        except OSError:
            continue
        for fd in fds:
            try:
                target = os.readlink(f"{fd_dir}/{fd}")
            except OSError:
                continue
            if target.startswith("socket:["):
                inode = int(target[8:-1])
                if inode in inodes:
                    found.setdefault(inode, pid)
    return found


def command_line(pid: int, limit: int = 80) -> str:
    try:
        raw = open(f"/proc/{pid}/cmdline", "rb").read()
    except OSError:
        return "?"
    text = raw.replace(b"\0", b" ").decode("utf-8", "replace").strip() or "?"
    return text if len(text) <= limit else text[:limit - 3] + "..."


def holders(ports: Container[int], ours: Iterable[int], address: str | None = None) -> dict[int, list[Holder]]:
    """Each port among `ports` held on `address` and who holds it; `ours` are the engines'
    process group ids."""
    sockets = bound_sockets(ports, address)
    if not sockets:
        return {}
    wanted = set().union(*sockets.values())
    our_pids = set(process.members(set(ours)))
    owner = socket_owners(wanted, sorted(our_pids))
    strangers = wanted - set(owner)
    if strangers:
        others = (int(e) for e in os.listdir("/proc") if e.isdigit() and int(e) not in our_pids)
        owner.update(socket_owners(strangers, others))
    out: dict[int, list[Holder]] = {}
    for port, inodes in sorted(sockets.items()):
        seen: set[int | None] = set()
        for inode in sorted(inodes):
            pid = owner.get(inode)
            if pid in seen:
                continue        # one process, several sockets (IPv4 and IPv6): name it once
            seen.add(pid)
            mine = pid in our_pids
            out.setdefault(port, []).append(
                Holder(port, pid, "" if mine or pid is None else command_line(pid), mine))
    return out


def foreign(held: dict[int, list[Holder]]) -> list[Holder]:
    return [h for hs in held.values() for h in hs if not h.ours]

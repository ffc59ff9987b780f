"""Which loopback addresses and engine ports a local cluster uses, so several run on one machine.

Slot k gives the cluster's nodes the addresses 127.0.(k+1).N and its engines the ports
FIRST_PORT + k*PORTS_PER_SLOT onwards (below Linux's ephemeral range; `free_port` picks the
components' ports from neither). A slot is held by an exclusive flock on
<tmp>/llmgw-dev-slots/<k>.lock for as long as the process that runs the cluster (`llmgw dev
up`, a test) holds it open: one that exits, however it exits, frees its slot.
"""
from __future__ import annotations

import fcntl
import os
import tempfile
from pathlib import Path

FIRST_PORT = 10000
PORTS_PER_SLOT = 500
SLOTS = (32768 - FIRST_PORT) // PORTS_PER_SLOT
MAX_NODES = 250   # 127.0.(k+1).1 .. .250


def slot_dir() -> Path:
    return Path(tempfile.gettempdir()) / "llmgw-dev-slots"


class Slot:
    def __init__(self, index: int, fd: int):
        self.index, self._fd = index, fd

    def address(self, i: int) -> str:
        """The loopback address of the cluster's i-th node (from 0)."""
        if not 0 <= i < MAX_NODES:
            raise ValueError(f"a local cluster has at most {MAX_NODES} nodes")
        return f"127.0.{self.index + 1}.{i + 1}"

    @property
    def port_range(self) -> str:
        first = FIRST_PORT + self.index * PORTS_PER_SLOT
        return f"{first}-{first + PORTS_PER_SLOT - 1}"

    def release(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


def acquire(prefer: int | None = None) -> Slot:
    """The first free slot, `prefer` first (the one the cluster directory used last time)."""
    directory = slot_dir()
    directory.mkdir(mode=0o1777, exist_ok=True)
    order = [k for k in range(SLOTS) if k != prefer]
    if prefer is not None and 0 <= prefer < SLOTS:
        order.insert(0, prefer)
    for k in order:
        fd = os.open(directory / f"{k}.lock", os.O_RDWR | os.O_CREAT, 0o666)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            continue
        return Slot(k, fd)
    raise RuntimeError(f"all {SLOTS} local cluster slots are in use (locks in {directory}); stop a cluster first")

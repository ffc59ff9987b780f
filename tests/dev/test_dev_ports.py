"""free_port: ports no outgoing connection can take, and no two processes are given alike.

A test's worker, `llmgw dev up` and a benchmark each hand ports to the components they start, which
bind them seconds later. The kernel's pick (bind port 0) lay in its ephemeral range, where any
process's outgoing connection could take it first; random picks above that range met between
processes (a sim's HTTP port was another test's ZeroMQ socket). Both fail here.
"""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from llmgw.dev.process import free_port

PER_PROCESS = 400
HOLD = f"""
import sys
from llmgw.dev.process import free_port
print(" ".join(str(free_port()) for _ in range({PER_PROCESS})), flush=True)
sys.stdin.read()   # held until the test has every process's ports
"""


def test_processes_reserving_at_once_never_share_a_port_and_none_is_ephemeral() -> None:
    low, high = map(int, Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
    procs = [subprocess.Popen([sys.executable, "-c", HOLD], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
             for _ in range(3)]
    try:
        mine = [free_port() for _ in range(PER_PROCESS)]   # while they pick theirs
        picked = [mine, *([int(p) for p in proc.stdout.readline().split()] for proc in procs if proc.stdout)]
    finally:
        for proc in procs:
            proc.communicate("")
    assert [len(ports) for ports in picked] == [PER_PROCESS] * 4
    every = [p for ports in picked for p in ports]
    assert len(set(every)) == len(every), "two processes were given the same port"
    assert not [p for p in every if low <= p <= high], f"ports in the ephemeral range {low}-{high}"

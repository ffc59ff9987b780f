"""The recorder's sampler on real processes and sockets: what it reports is what the invariants
judge, so a listener it cannot see is a case that cannot fire."""
from __future__ import annotations

import socket
from dataclasses import replace

from llmgw.dev import slots
from tests.robustness import invariants as inv
from tests.robustness.history import History
from tests.robustness.recorder import Recorder
from tests.robustness.test_robustness_invariants import changes, shard


def _binds(sock: socket.socket, address: str, port: int) -> bool:
    """Whether `sock` could bind there (a port of the range may be held by something else on
    this machine: the first one was, once, in a full run beside other work)."""
    try:
        sock.bind((address, port))
    except OSError:
        return False
    return True


def test_a_foreign_listener_in_the_agents_port_range_is_seen_and_judged(tmp_path):
    """A listener on a node's address in the port range a slot gives the agents (the range the
    harness passes the recorder) is foreign; two shards given its port break foreign_port_once."""
    slot = slots.acquire()
    squatter = socket.socket()
    try:
        first, last = (int(p) for p in slot.port_range.split("-"))
        address = slot.address(0)
        port = next(p for p in range(first, last + 1) if _binds(squatter, address, p))
        squatter.listen()
        h = History(addresses={"n1": address})
        rec = Recorder(None, tmp_path, h, range(first, last + 1))
        h.samples += [rec.sample(), rec.sample()]
        assert {(a, p) for a, p, _ in h.samples[0].foreign} == {(address, port)}
        mid = (h.samples[0].t + h.samples[1].t) / 2     # given while the samples saw the squatter
        h.changes = [replace(c, t=mid) for c in changes("shards", shard("m-a-0", "Pending", uid="u1", port=port),
                                                          shard("m-b-0", "Pending", uid="u2", port=port))]
        assert "given to 2 shards" in inv.foreign_port_once(h)[0]
    finally:
        squatter.close()
        slot.release()

"""What a fault-injection run recorded: object changes, engine samples, requests, faults.

Everything here is plain data; the invariant checkers (invariants.py) are pure functions
over a History, so they can be fed hand-made histories too. Times are `time.monotonic()`
seconds of the test process (the recorder, the sampler, the load and the nemeses share it).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterator


@dataclass(frozen=True)
class Change:
    """An object as it was after etcd revision `revision` (`deleted`: the last copy before it went)."""

    t: float
    revision: int
    kind: str          # replicas, shards, models, nodes
    name: str
    obj: Any           # the llmgw.api object
    deleted: bool = False


@dataclass(frozen=True)
class Engine:
    """One engine process at a sample: what it claims (argv, environment) and what it holds (sockets)."""

    pid: int
    node: str
    host: str
    gpus: tuple[int, ...]
    ports: tuple[int, ...]                          # declared: serve port, and the dist-init port on rank 0
    listening: tuple[tuple[str, int], ...] = ()     # (address, port) sockets it listens on
    stopped: bool = False                           # SIGSTOPped (still holds what it holds)


@dataclass(frozen=True)
class Sample:
    t: float
    engines: tuple[Engine, ...]
    foreign: tuple[tuple[str, int, int], ...] = ()  # (address, port, socket inode) listeners no engine owns
    holders: tuple[tuple[int, str], ...] = ()       # (inode, "pid command") of the foreign ones, where seen


@dataclass(frozen=True)
class Request:
    start: float
    end: float
    model: str
    ok: bool
    detail: str = ""
    replica: str = ""      # the replica that answered (the gateway's X-Llmgw-Replica)
    first: float = 0.0     # when its response started (headers); 0: it never did
    streamed: bool = False


@dataclass(frozen=True)
class Fault:
    t: float
    nemesis: str       # kill-agent, stop-agent, cont-agent, kill-engine, kill-leader, kill-server, ...
    target: str


@dataclass(frozen=True)
class WatchResume:
    """A watch resumed at `revision`, once on etcd itself and once through the server; each
    outcome is "events" (the next change came), "Expired" (410 / compacted) or an error."""

    t: float
    revision: int
    etcd: str
    server: str


@dataclass
class History:
    changes: list[Change] = field(default_factory=list)
    samples: list[Sample] = field(default_factory=list)
    requests: list[Request] = field(default_factory=list)
    faults: list[Fault] = field(default_factory=list)
    resumes: list[WatchResume] = field(default_factory=list)
    addresses: dict[str, str] = field(default_factory=dict)   # node -> the address its engines bind
    unconverged: list[str] = field(default_factory=list)      # what the scenario's settle() waited for in vain

    def ordered(self, kind: str) -> list[Change]:
        return sorted((c for c in self.changes if c.kind == kind), key=lambda c: c.revision)

    def states(self, kind: str) -> Iterator[tuple[Change, dict[str, Any]]]:
        """After each change of `kind` (in revision order): the change and every object then existing."""
        live: dict[str, Any] = {}
        for c in self.ordered(kind):
            if c.deleted:
                live.pop(c.name, None)
            else:
                live[c.name] = c.obj
            yield c, live

    def at(self, kind: str, t: float) -> dict[str, Any]:
        """The objects of `kind` as the recorder knew them at time t."""
        live: dict[str, Any] = {}
        for c in sorted((c for c in self.changes if c.kind == kind and c.t <= t), key=lambda c: c.revision):
            if c.deleted:
                live.pop(c.name, None)
            else:
                live[c.name] = c.obj
        return live

    def summary(self) -> str:
        failed = sum(1 for r in self.requests if not r.ok)
        return (f"{len(self.changes)} changes, {len(self.samples)} samples, {len(self.requests)} requests "
                f"({failed} failed), {len(self.faults)} faults")

"""The GPUs and ports this node's engines may hold, so a new engine never starts on a busy one.

Each shard runner, and each engine of a record no shard claimed (an orphan
being stopped), has a Claim: its GPUs and ports, the process groups of its
engine, and whether those processes may still exist. A runner starts its
engine only once no other unreleased claim overlaps its GPUs or ports, and
only after the agent has seen its first full list of shards (so every engine
it found running is either adopted or being stopped). An engine whose shard
is gone is released when its process groups are confirmed gone, not when
its stop begins: a stopping engine still answers on its port.
"""
from __future__ import annotations

import asyncio
from typing import Callable, Iterable


class Claim:
    def __init__(self, owner: str, gpus: Iterable[int] | None, ports: Iterable[int] | None,
                 held: bool = False):
        self.owner = owner              # "shard NAME", for messages
        self.gpus = None if gpus is None else set(gpus)     # None: any (an old record)
        self.ports = None if ports is None else set(ports)
        self.pgids: list[int] = []
        self.released = asyncio.Event()
        if not held:
            self.released.set()

    def hold(self, pgids: Iterable[int] = ()) -> None:
        self.pgids = list(pgids)
        self.released.clear()

    def release(self) -> None:
        self.pgids = []
        self.released.set()

    def overlap(self, other: "Claim") -> str:
        """What the two claims share, in words ("" when nothing)."""
        parts = []
        for what, mine, theirs in (("GPU", self.gpus, other.gpus), ("port", self.ports, other.ports)):
            if mine is None or theirs is None:      # unknown: overlaps whatever the other has
                known = theirs if mine is None else mine
                shared = sorted(known) if known is not None else None
                if shared is None or shared:
                    parts.append(f"{what}s {shared}" if shared else f"any {what}s")
                continue
            shared = sorted(mine & theirs)
            if shared:
                parts.append(f"{what}{'s' if len(shared) > 1 else ''} {', '.join(map(str, shared))}")
        return " and ".join(parts)


class Claims:
    def __init__(self) -> None:
        self._claims: list[Claim] = []
        self.ready = asyncio.Event()     # set once the first list of shards has been handled

    def add(self, claim: Claim) -> Claim:
        self._claims.append(claim)
        return claim

    def discard(self, claim: Claim) -> None:
        if claim in self._claims:
            self._claims.remove(claim)

    def groups(self) -> list[int]:
        """Process group ids of every engine of this node that may be running."""
        return [g for c in self._claims if not c.released.is_set() for g in c.pgids]

    def blocker(self, claim: Claim) -> tuple[Claim, str] | None:
        for other in self._claims:
            if other is not claim and not other.released.is_set():
                shared = other.overlap(claim)
                if shared:
                    return other, shared
        return None

    async def wait_turn(self, claim: Claim, waiting: Callable[[str], None]) -> None:
        """Hold `claim` once it overlaps no unreleased claim; say what it waits for meanwhile."""
        await self.ready.wait()
        while (found := self.blocker(claim)) is not None:
            other, shared = found
            waiting(f"waiting for the engine of {other.owner} to stop: it holds {shared}")
            await other.released.wait()
        claim.hold()      # no await since the check: no other claim can have taken them

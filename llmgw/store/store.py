"""Store: the object client on one etcd connection, with the store's other concerns beside it.

    store = await Store("http://127.0.0.1:2379").connect()
    await store.get(Model, "m1")                    # objects (llmgw.store.objects)
    await store.kv.put(key, value)                  # raw keys (kv)
    await store.leases.grant(15)                    # leases (leases)
    await store.heartbeats.beat("node-a")           # heartbeats (leases)
    await store.election.campaign("c", "me")        # leader election (election)
    await store.events.record(...)                  # events (events)
    await store.revocations.add(serial)             # revoked certificates (revocations)
    await store.names.migrate()                     # served model names (names), a Model's write hook
    store.lister_watcher(Model)                     # a reflector's lister-watcher (listwatch); also
    store.heartbeats.lister_watcher()               #   of the live heartbeats
    await store.demand.report(report)               # the gateways' demand reports (demand), leased
    await store.members.announce("server", member)  # a server's or controller-manager's (members), leased
    store.revocations.lister_watcher()              #   and of the revoked serials
    Compactor(store.etcd, keep=..., interval=...)   # compaction (compaction), a leader-only runnable

Every concern is built on ``store.etcd`` (llmgw.store.etcd), the one
connection with its write batcher. ``fenced()`` is a view on the same
connection whose writes (objects, raw keys, events, revocations) require a
leader key; what the concerns remember (heartbeat and event leases) is shared
with it.
"""
from __future__ import annotations

import asyncio
import copy
import logging
import time
from types import TracebackType

from llmgw.api import Model, ObjectT
from llmgw.api.client import ObjectClient
from llmgw.backoff import Backoff
from llmgw.store.connection import Connection
from llmgw.store.demand import Demand
from llmgw.store.election import Election
from llmgw.store.errors import StoreUnavailable
from llmgw.store.etcd import Etcd
from llmgw.store.events import Events, Stamps
from llmgw.store.kv import KV
from llmgw.store.leases import Heartbeats, Leases
from llmgw.store.listwatch import AfterErrorPolicy, StoreObjects, after_store_error
from llmgw.store.members import Members
from llmgw.store.names import Names
from llmgw.store.objects import Held, Objects
from llmgw.store.revocations import Revocations

log = logging.getLogger("llmgw.store")


class Store(Objects):
    kv: KV
    leases: Leases
    heartbeats: Heartbeats
    demand: Demand
    members: Members
    election: Election
    events: Events
    revocations: Revocations
    names: Names

    def __init__(self, endpoints: str | list[str], *, ca: str | None = None, cert: str | None = None,
                 key: str | None = None, timeout: float = 5.0, batch_writes: bool = True):
        """batch_writes: concurrent writing transactions go to etcd together (llmgw.store.batcher)."""
        conn = Connection(endpoints, ca=ca, cert=cert, key=key, timeout=timeout)
        super().__init__(Etcd.open(conn, batch_writes=batch_writes))
        self._event_stamps = Stamps()
        self._build()

    def _build(self) -> None:
        """The concerns on self.etcd, with the state the Store keeps for them."""
        etcd = self.etcd
        self.kv = KV(etcd)
        self.leases = Leases(etcd)
        self.heartbeats = Heartbeats(etcd, self.kv, self.leases)
        self.demand = Demand(self.kv, self.leases)
        self.members = Members(self.kv, self.leases)
        self.election = Election(etcd, self.kv, self.leases)
        self.events = Events(etcd, self.kv, self.leases, self._event_stamps)
        self.revocations = Revocations(self.kv)
        self.names = Names(etcd)
        self.hooks = {Model: self.names}   # a Model's write reserves and releases its served names

    def lister_watcher(self, kind: type[ObjectT], after_error: AfterErrorPolicy = after_store_error,
                       held: Held | None = None) -> StoreObjects[ObjectT]:
        """The objects of ``kind`` as a reflector's lister-watcher (llmgw.store.listwatch); `held`:
        as for ``watch``."""
        return StoreObjects(self, kind, after_error, held)

    # ------------------------------------------------------------ lifecycle

    async def connect(self, wait: float = 0.0) -> Store:
        """Fail now, with the endpoint named, if etcd does not answer; with `wait`, try again for
        that many seconds first (a component started while etcd restarts or has no quorum waits for
        it, as a restarted process under a supervisor would, instead of dying into a restart loop)."""
        await self.etcd.conn.client()
        backoff, deadline = Backoff(0.2, 5.0), time.monotonic() + wait
        while True:
            try:
                await self.revision()
                return self
            except StoreUnavailable as err:
                left = deadline - time.monotonic()
                if left <= 0 or err.misconfigured:
                    raise
                delay = min(backoff.next(), left)
                log.warning("etcd does not answer yet (%s); trying again in %.1fs", err, delay)
                await asyncio.sleep(delay)

    async def close(self) -> None:
        await self.etcd.conn.close()

    async def __aenter__(self) -> Store:
        return await self.connect()

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        await self.close()

    def fenced(self, leader_key: str, create_revision: int) -> Store:
        """A view on the same connection whose writes require leader_key's create_revision:
        they raise FencedOut once another holder took the key."""
        view = copy.copy(self)
        view.etcd = self.etcd.fenced(leader_key, create_revision)
        view._build()
        return view


# The static check that Store is what controllers and the server program against.
_object_client: type[ObjectClient] = Store

"""Leader election on /llmgw/leader/<component> through the store's election (llmgw.store.election).

``LeaderElector.acquire()`` campaigns until it holds the key (bound to a lease
of ``lease_seconds``): again as soon as a watch sees the holder's key go (it
resigned, or its lease expired), or after ``lease_seconds`` at the latest.  ``hold(leadership)`` renews
the lease every ``retry`` seconds and returns when leadership is lost: the
lease expired, or no renewal succeeded within ``renew_deadline`` (so we stop
acting before another manager can take over).  Defaults follow Kubernetes:
lease 15 s, renew deadline 10 s, retry 2 s (scaled with the lease).
"""
from __future__ import annotations

import asyncio
import logging
import time
from typing import Protocol

from llmgw.store.election import Election
from llmgw.store.errors import StoreError
from llmgw.store.leases import Leases

log = logging.getLogger("llmgw.leader")


class Leadership(Protocol):
    """A held leader key, bound to a lease (llmgw.store's Leadership)."""

    key: str
    lease_id: int
    create_revision: int       # of the leader key: the fence of every write while it is held

    async def resign(self) -> None: ...


class Campaigner(Protocol):
    """What leader election needs of the store: its election and its leases."""

    @property
    def election(self) -> Election: ...

    @property
    def leases(self) -> Leases: ...


class LeaderElector:
    def __init__(self, store: Campaigner, component: str, identity: str, lease_seconds: float = 15.0):
        self.store = store
        self.component = component
        self.identity = identity
        self.lease_seconds = max(1, int(round(lease_seconds)))
        self.renew_deadline = self.lease_seconds * 2 / 3
        self.retry = max(0.2, self.lease_seconds / 7.5)

    async def acquire(self) -> Leadership:
        """Block until this identity holds the leader key; returns the store's Leadership."""
        while True:
            try:
                leadership = await self.store.election.campaign(self.component, self.identity, self.lease_seconds)
            except StoreError as err:
                log.warning("campaign for %s failed: %s", self.component, err)
                leadership = None
            if leadership is not None:
                log.info("%s: %s is the leader (create_revision %d)", self.component, self.identity,
                         leadership.create_revision)
                return leadership
            try:   # the holder's key gone is the moment to campaign; bounded should the watch miss it
                await asyncio.wait_for(self.store.election.vacated(self.component), self.lease_seconds)
            except asyncio.TimeoutError:
                pass
            except StoreError as err:
                log.warning("watching the leader key of %s failed: %s", self.component, err)
                await asyncio.sleep(self.retry)

    async def hold(self, leadership: Leadership) -> None:
        """Renew until leadership is lost; then return."""
        last_ok = time.monotonic()
        while True:
            await asyncio.sleep(self.retry)
            try:
                alive = await asyncio.wait_for(self.store.leases.refresh(leadership.lease_id), self.retry * 2)
            except (StoreError, asyncio.TimeoutError) as err:
                if time.monotonic() - last_ok > self.renew_deadline:
                    log.error("%s: could not renew the leader lease for %.0fs (%s); stepping down",
                              self.component, self.renew_deadline, err)
                    return
                continue
            if not alive:
                log.error("%s: leader lease expired; stepping down", self.component)
                return
            last_ok = time.monotonic()

"""The server's shared watch cache: one store watch per kind, fanned out to every HTTP watch.

Like the Kubernetes apiserver's watch cache. Per kind, started on the first watch of it:

* one `Store.watch(kind)` over all nodes, run by a reflector (llmgw.reflector) that starts
  at a revision instead of a list. When the stream drops (StoreUnavailable) it is re-opened
  from the last revision + 1, after a backoff (llmgw.backoff), and open watches stay open
  (they get BOOKMARKs meanwhile). When that revision was compacted meanwhile, the
  reflector "relists": the cache starts over at etcd's current revision and every open
  watch is told 410 Expired (it relists);
* a ring of the last `size` events of the kind, with their revisions. Each event's JSON
  line is made once, in the exact form the handler always wrote
  (`{"type": T, "object": {...}, "revision": R}`), and the same bytes go to every watcher;
* watchers, indexed by node (a node's shards are dispatched only to that node's watchers and
  to unscoped ones), each with its filter (node, labelSelector, "after revision R") and a
  bounded queue. The pump never awaits a watcher: one that falls more than `queue_limit`
  events behind is dropped and told 410 Expired, so one slow client cannot hold up the rest.

A watch from revision R gets the ring's events after R when R is inside the ring's window
(R >= `oldest`, the revision of the last event evicted, or the revision the cache started
at), and then every later event. An older R that etcd still has (the server checks that R
was not compacted first, see `check_revision`) rewinds the cache: its store watch starts
again from R + 1 and the ring is rebuilt from there. Each watcher remembers the last
event it was offered, as (revision, place among that revision's events: one transaction
can change several objects), so the replay reaches only watchers that have not had it yet,
in order. So a restarted server (whose cache starts at the first watch's revision) or a client
far behind costs a replay from etcd, not a relist; only a compacted R gets 410 Expired.
"""
from __future__ import annotations

import asyncio
import json
import logging
import sys
from collections import deque
from collections.abc import AsyncIterator, Sequence
from typing import Any

from llmgw.api import KINDS, AnyObject, errors, node_of
from llmgw.api.client import EventType
from llmgw.api.selectors import Selector
from llmgw.backoff import Backoff
from llmgw.reflector import AfterError, Event, Reflector, object_name
from llmgw.server.status import status_body
from llmgw.store.errors import Compacted, Restored
from llmgw.store.etcd import Lineage
from llmgw.store.listwatch import after_store_error_never_raise
from llmgw.store.store import Store

log = logging.getLogger("llmgw.server")

_MODIFIED = b'{"type": "MODIFIED"'
ALL = sys.maxsize     # (R, ALL): every event of revision R and before
_DELETED = b'{"type": "DELETED"'
_COMPACTED = "history the watch cache needed was compacted"


def error_line(code: int, reason: str, message: str) -> bytes:
    return (json.dumps({"type": "ERROR", "object": status_body(code, reason, message)}) + "\n").encode()


def bookmark_line(revision: int) -> bytes:
    bookmark = {"type": "BOOKMARK", "object": {"metadata": {"resourceVersion": revision}}, "revision": revision}
    return (json.dumps(bookmark) + "\n").encode()


def event_line(type_: str, obj_doc: dict[str, Any], revision: int) -> bytes:
    return (json.dumps({"type": type_, "object": obj_doc, "revision": revision}) + "\n").encode()


async def check_revision(store: Store, after: int) -> int:
    """etcd's current revision, once it is known that etcd still has every change after `after`.

    Raises Expired when `after` + 1 was compacted: a watch from `after` must relist, even if
    the ring still holds those events (the contract: 410 when R was compacted). And when `after`
    is newer than etcd's revision: etcd was restored from a snapshot, and a watch from there would
    skip every change up to it; the client relists what the restored etcd holds.
    """
    try:
        current = await store.revision(since=after)
    except Compacted:
        raise errors.Expired(f"resourceVersion {after} was compacted; relist and watch from the list's "
                      "resourceVersion") from None
    if after > current:
        raise errors.Expired(f"resourceVersion {after} is newer than etcd's revision {current} (etcd restored "
                             "from a snapshot); relist and watch from the list's resourceVersion")
    return current


class CachedEvent:
    """One change, serialized once; the fields the watchers' filters need."""

    __slots__ = ("type", "revision", "position", "node", "labels", "line", "_as_deleted")

    def __init__(self, type_: EventType, obj: AnyObject, revision: int):
        self.type, self.revision = type_, revision
        self.position = (revision, 0)   # (revision, place in it), set by the cache
        self.node = node_of(obj)
        self.labels = obj.metadata.labels
        self.line = event_line(type_, obj.model_dump(mode="json"), revision)
        self._as_deleted: bytes | None = None

    def as_deleted(self) -> bytes:
        """This MODIFIED event as DELETED: the object left a watcher's labelSelector."""
        if self._as_deleted is None:
            self._as_deleted = _DELETED + self.line[len(_MODIFIED):]
        return self._as_deleted


class Watcher:
    """One HTTP watch: its filter and its bounded queue of (shared) event lines."""

    def __init__(self, cache: "KindCache", after: int, node: str | None, selector: Selector | None,
                 limit: int, who: str):
        self.cache, self.node, self.selector = cache, node, selector
        self.seen = (after, ALL)  # the position of the last event offered to it
        self.limit, self.who = limit, who
        self.pending: deque[bytes] = deque()
        self.allowance = limit    # the backlog from the ring is allowed on top of the limit
        self.error: tuple[int, str, str] | None = None
        self._waiter: asyncio.Future[bool] | None = None

    def accept(self, ev: CachedEvent) -> bytes | None:
        """The line this watcher should get for `ev`, or None (also when it was offered before)."""
        if ev.position <= self.seen:
            return None
        if self.node is not None and ev.node != self.node:
            return None
        if self.selector is not None and not self.selector.matches(ev.labels):
            return ev.as_deleted() if ev.type == "MODIFIED" else None  # it left the selector
        return ev.line

    def offer(self, ev: CachedEvent) -> bool:
        """Queue `ev` if it passes the filter; False when the queue is full (the watcher failed)."""
        line = self.accept(ev)
        self.seen = max(self.seen, ev.position)   # offered: a replay after a rewind skips it
        if line is None or self.error is not None:
            return True
        if len(self.pending) >= self.allowance:
            self.fail(410, "Expired", f"this watch fell more than {self.limit} events behind and was closed; "
                      "relist and watch from the list's resourceVersion")
            return False
        self.pending.append(line)
        self._wake(True)
        return True

    def fail(self, code: int, reason: str, message: str) -> None:
        """End the watch: the stream sends this ERROR next, and nothing else."""
        if self.error is None:
            self.error = (code, reason, message)
            self.pending.clear()
            self._wake(True)

    def _wake(self, value: bool) -> None:
        w = self._waiter
        if w is not None and not w.done():
            w.set_result(value)

    def bookmark_revision(self) -> int:
        # Every event up to cache.rev has been offered, and nothing is pending.
        return max(self.seen[0], self.cache.rev)

    async def stream(self, idle: float) -> AsyncIterator[bytes]:
        """Chunks to write: the queued lines (as one chunk), a BOOKMARK after `idle` seconds without
        any, and, when the watch fails, the ERROR line, which ends it."""
        loop = asyncio.get_running_loop()
        while True:
            if self.error is not None:
                yield error_line(*self.error)
                return
            if self.pending:
                chunk = b"".join(self.pending)
                self.pending.clear()
                self.allowance = self.limit
                yield chunk
                continue
            fut = self._waiter = loop.create_future()
            timer = loop.call_later(idle, self._wake, False)
            try:
                woke = await fut
            finally:
                timer.cancel()
                self._waiter = None
            if not woke and not self.pending and self.error is None:
                # (an event offered after the timer fired goes first: the bookmark would skip it)
                yield bookmark_line(self.bookmark_revision())

    def close(self) -> None:
        self.cache.unsubscribe(self)


class KindCache:
    """The watch cache of one kind (see the module's docstring)."""

    def __init__(self, store: Store, kind: str, size: int = 10000, queue_limit: int = 1000,
                 max_backoff: float = 5.0):
        if size < 1 or queue_limit < 1:
            raise ValueError("watch cache size and queue limit must be at least 1")
        self.store, self.kind, self.size, self.queue_limit = store, kind, size, queue_limit
        self.max_backoff = max_backoff
        self.ring: deque[CachedEvent] = deque()
        self.oldest = 0   # a watch from R >= oldest is served from the ring
        self.rev = 0      # every event up to this revision has been dispatched
        self.pos = (0, ALL)  # the position of the last event dispatched
        self._watchers: dict[str | None, set[Watcher]] = {}  # by node; None: every node
        self._task: asyncio.Task[None] | None = None
        self._retired: set[asyncio.Task[None]] = set()   # pumps cancelled by a rewind, still ending

    @property
    def started(self) -> bool:
        return self._task is not None

    def watcher_count(self) -> int:
        return sum(len(ws) for ws in self._watchers.values())

    def start(self, revision: int) -> None:
        """Start watching after `revision` (a revision etcd still has), unless already started."""
        if self._task is None:
            self.oldest = self.rev = revision
            self.pos = (revision, ALL)
            self._task = self._pump()

    def _pump(self) -> asyncio.Task[None]:
        """The reflector that feeds the cache, from the revision after ``self.rev``."""
        reflector = Reflector(_History(self), self._dispatch, key=object_name, known=_nothing, start_revision=self.rev,
                              backoff=Backoff(0.1, self.max_backoff),
                              burst=100,   # a long burst: let the watchers write what they have
                              name=f"watch cache of {self.kind}")
        return asyncio.create_task(reflector.run(), name=f"watch-cache-{self.kind}")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, *self._retired, return_exceptions=True)
        for w in [w for ws in self._watchers.values() for w in ws]:
            w.fail(503, "ServiceUnavailable", "the server is shutting down; watch again")
        self._watchers.clear()

    # ------------------------------------------------------------ watchers
    def subscribe(self, after: int, node: str | None = None, selector: Selector | None = None,
                  who: str = "") -> Watcher:
        """A watcher of the events after revision `after`, which etcd must still have (see
        `check_revision`); those already in the ring are queued at once. An `after` older than
        the ring's window rewinds the cache to it."""
        if self._task is None:
            raise RuntimeError("start() the cache before subscribing")
        if after < self.oldest:
            self._rewind(after)
        w = Watcher(self, after, node, selector, self.queue_limit, who)
        backlog = []
        for ev in reversed(self.ring):
            if ev.revision <= after:
                break
            line = w.accept(ev)
            if line is not None:
                backlog.append(line)
        backlog.reverse()
        w.pending.extend(backlog)
        w.seen = max(w.seen, self.pos)   # every event dispatched has been offered to it
        w.allowance = self.queue_limit + len(backlog)
        self._watchers.setdefault(node, set()).add(w)
        return w

    def unsubscribe(self, w: Watcher) -> None:
        ws = self._watchers.get(w.node)
        if ws is not None:
            ws.discard(w)
            if not ws and w.node is not None:
                del self._watchers[w.node]

    # ------------------------------------------------------------ the pump
    def _dispatch(self, type_: EventType, obj: AnyObject, revision: int) -> None:
        ev = CachedEvent(type_, obj, revision)
        place = self.pos[1] + 1 if ev.revision == self.pos[0] else 0
        ev.position = self.pos = (ev.revision, place)
        self.ring.append(ev)
        if len(self.ring) > self.size:
            self.oldest = self.ring.popleft().revision
        dropped = []
        for group in (self._watchers.get(None), self._watchers.get(ev.node) if ev.node is not None else None):
            if group:
                for w in group:
                    if not w.offer(ev):
                        dropped.append(w)
        for w in dropped:
            self.unsubscribe(w)
            log.warning("watch of %s by %s closed: more than %d events behind (a slow client); it will relist",
                        self.kind, w.who or "?", w.limit)
        if ev.revision > self.rev:
            self.rev = ev.revision

    def _rewind(self, after: int) -> None:
        """Watch etcd again from `after` + 1 and rebuild the ring from there; open watchers keep
        going (each skips what it was already offered)."""
        log.info("watch cache of %s rewinds from %d to revision %d for a watch resumed from there",
                 self.kind, self.oldest, after)
        old = self._task
        if old is not None:
            old.cancel()     # suspended at an await: it dispatches nothing more
            self._retired.add(old)
            old.add_done_callback(self._retired.discard)
        self.ring.clear()
        self.oldest = self.rev = after
        self.pos = (after, ALL)
        self._task = self._pump()

    def _rebase(self, revision: int, why: str) -> None:
        """Start over at `revision`: the events in between are lost, so every watcher relists."""
        watchers = [w for ws in self._watchers.values() for w in ws]
        for w in watchers:
            w.fail(410, "Expired", why)
        self._watchers.clear()
        self.ring.clear()
        self.oldest = self.rev = revision
        self.pos = (revision, ALL)
        log.warning("watch cache of %s starts over at revision %d (%s); %d open watches relist",
                    self.kind, revision, why, len(watchers))



class _History:
    """What feeds a KindCache, as a reflector's lister-watcher: the store's changes of its
    kind. The cache holds history, not objects, so its "list" is a fresh start: at etcd's
    current revision, with every open watch told to relist (KindCache._rebase). That is
    also what an etcd restored under the server comes to: its watch is Restored (etcd's
    revision went back, or its cluster id changed: ``Etcd.same_history``), a Compacted."""

    def __init__(self, cache: KindCache) -> None:
        self.cache = cache
        self.lineage = Lineage()
        self.gone = _COMPACTED   # why the next list starts over

    async def list(self) -> tuple[Sequence[AnyObject], int]:
        revision = await self.cache.store.revision()
        self.cache._rebase(revision, self.gone)
        return (), revision

    def watch(self, from_revision: int) -> AsyncIterator[Event[AnyObject]]:
        return self.cache.store.watch(KINDS[self.cache.kind], from_revision, lineage=self.lineage)

    def after_error(self, err: Exception) -> AfterError:
        """Compacted: start over. Anything else, StoreUnavailable mostly: watch again from where it stopped."""
        if isinstance(err, Compacted):
            self.gone = str(err) if isinstance(err, Restored) else _COMPACTED
        return after_store_error_never_raise(err)



def _nothing() -> tuple[()]:
    return ()


class WatchCache:
    """The per-kind caches of one server, each started on the first watch of its kind."""

    def __init__(self, store: Store, size: int = 10000, queue_limit: int = 1000):
        if size < 1 or queue_limit < 1:
            raise ValueError("watch cache size and queue limit must be at least 1")
        self.store, self.size, self.queue_limit = store, size, queue_limit
        self._kinds: dict[str, KindCache] = {}

    def kind(self, kind: str) -> KindCache:
        cache = self._kinds.get(kind)
        if cache is None:
            cache = self._kinds[kind] = KindCache(self.store, kind, self.size, self.queue_limit)
        return cache

    async def stop(self) -> None:
        await asyncio.gather(*(c.stop() for c in self._kinds.values()))

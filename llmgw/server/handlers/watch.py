"""Watches: `GET /{kind}?watch=1`, `GET /events?watch=1` and `GET /revocations?watch=1`, streams of
JSON lines: events after ?resourceVersion= (none: every current item as ADDED first), BOOKMARKs
while idle, and one ERROR before the end (410 Expired: relist; 503 when the server stops: re-watch
from the last revision; 401 when the client's certificate is revoked or expires while the watch is
open).

Objects are served by the shared watch cache (llmgw/server/watchcache.py): one store watch per
kind, whatever the number of HTTP watches; while etcd is unreachable, the stream stays open
(BOOKMARKs) and the cache resumes where it stopped. Events each have their own store watch
(llmgw/server/events.py)."""
from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator, Callable
from datetime import datetime, timezone
from typing import Any, Literal

from aiohttp import web

from llmgw.api import KINDS, AnyObject
from llmgw.api.errors import BadRequest, Expired
from llmgw.api.secrets import REDACTED
from llmgw.api.selectors import Selector
from llmgw.pki import Identity
from llmgw.server.events import EventWatch
from llmgw.server.metrics import ServerMetrics
from llmgw.server.request import HIDE_KEY_HASHES, dump, resource_version, shown
from llmgw.server.revocations import Revocations
from llmgw.server.watchcache import WatchCache, check_revision, error_line, event_line
from llmgw.store import Store

log = logging.getLogger("llmgw.server")
# what a watch streams: its chunks, and how to end it with an ERROR (code, reason, message)
Stream = tuple[AsyncIterator[bytes], Callable[[int, str, str], None]]
GOING_AWAY = "the server is shutting down; watch again on another server from the last resourceVersion"


class Watches:
    def __init__(self, store: Store, cache: WatchCache, revocations: Revocations, metrics: ServerMetrics,
                 bookmark_interval: float) -> None:
        self.store, self.cache, self.revocations, self.metrics = store, cache, revocations, metrics
        self.bookmark_interval = bookmark_interval
        self._open: set[Callable[[int, str, str], None]] = set()   # each open watch's fail
        self.draining = False

    def drain(self) -> None:
        """The server stops: every open watch, and any opened from now on, ends with a 503 ERROR,
        so that its client watches again on another server at once, not when the stream is cut."""
        self.draining = True
        for fail in list(self._open):
            fail(503, "ShuttingDown", GOING_AWAY)

    async def objects(self, request: web.Request, kind: str) -> web.StreamResponse:
        """The objects of `kind` (?node='s, ?labelSelector='s), from the watch cache."""
        q = request.query
        node, selector, rv = q.get("node") or None, q.get("labelSelector") or None, resource_version(q)
        if node is not None and KINDS[kind].scope != "Node":
            raise BadRequest(f"kind {kind} is not keyed by node")
        sel = Selector.parse(selector) if selector else None
        cache = self.cache.kind(kind)
        initial: list[AnyObject] = []
        expired: str | None = None
        if rv:
            try:
                current = await check_revision(self.store, rv)  # 410 if etcd compacted rv, as before
            except Expired as err:
                expired = str(err)
            else:
                cache.start(min(rv, current))
        else:
            initial, rv = await self.store.list(KINDS[kind], selector=selector, node=node)
            cache.start(rv)
        if expired is not None:
            return await self._serve(request, kind, error_line(410, "Expired", expired), None)
        # no await since the revision check or the list: nothing can slip in between
        watcher = cache.subscribe(rv, node=node, selector=sel, who=f"{request['identity']} ({request.remote})")
        stream = watcher.stream(self.bookmark_interval)
        try:
            return await self._serve(request, kind,
                                     b"".join(event_line("ADDED", dump(shown(request, o)), rv) for o in initial),
                                     (_hashes_redacted(stream) if request.get(HIDE_KEY_HASHES) else stream,
                                      watcher.fail))
        finally:
            watcher.close()

    async def events(self, request: web.Request) -> web.StreamResponse:
        """Events as an object watch streams objects (every object's, ?kind='s, or ?kind=&name='s)."""
        # ?kind= and ?name= were checked with the URL (app.py's url_action)
        kind, name = request.query.get("kind") or None, request.query.get("name") or None
        return await self._own_watch(request, "events", kind, name)

    async def revoked(self, request: web.Request) -> web.StreamResponse:
        """The revoked serials ({"serial": ...}) as events are watched."""
        return await self._own_watch(request, "revocations", None, None)

    async def _own_watch(self, request: web.Request, what: Literal["events", "revocations"], kind: str | None,
                         name: str | None) -> web.StreamResponse:
        """A watch with a store watch of its own (llmgw/server/events.py): without ?resourceVersion=,
        every current item ADDED first; then each change."""
        rv = resource_version(request.query)
        initial: list[dict[str, Any]] = []
        if rv:
            try:
                await check_revision(self.store, rv)
            except Expired as err:   # relist
                return await self._serve(request, what, error_line(410, "Expired", str(err)), None)
        elif what == "events":
            initial, rv = await self.store.events.list_all(kind, name)
        else:
            serials, rv = await self.store.revocations.lister_watcher().list()
            initial = [{"serial": s} for s in serials]
        watch = EventWatch(self.store, rv, kind, name, limit=self.cache.queue_limit, what=what)
        return await self._serve(request, what, b"".join(event_line("ADDED", e, rv) for e in initial),
                                 (watch.stream(self.bookmark_interval), watch.fail))

    async def _serve(self, request: web.Request, what: str, first: bytes, then: Stream | None) -> web.StreamResponse:
        """A watch's answer: `first` (the current items as ADDED, or the ERROR that ends it), then the
        chunks of `then`'s stream until it ends or the client goes; its `fail` ends it with a 401 when
        the client's certificate is revoked or expires. Counted among the open watches of `what`."""
        resp = web.StreamResponse(headers={"Content-Type": "application/x-ndjson", "Cache-Control": "no-cache"})
        unbind = self._end_with_identity(then[1], request["identity"], what, request.remote) if then else None
        if then is not None:
            self._open.add(then[1])
            if self.draining:
                then[1](503, "ShuttingDown", GOING_AWAY)
        open_watches = self.metrics.watches.labels(what)
        open_watches.inc()
        try:
            await resp.prepare(request)
            if first:
                await resp.write(first)
            if then is not None:
                async for chunk in then[0]:
                    await resp.write(chunk)
        except (ConnectionResetError, ConnectionError):
            pass  # the client went away
        finally:
            open_watches.dec()
            if then is not None:
                self._open.discard(then[1])
            if unbind is not None:
                unbind()
        return resp

    def _end_with_identity(self, fail: Callable[[int, str, str], None], who: Identity, kind: str,
                           peer: str | None) -> Callable[[], None]:
        """End a watch (through its `fail`) with a 401 ERROR and a log line when its certificate is
        revoked (the revocation watch calls back) or reaches notAfter (a timer). Returns the undo."""
        def end(reason: str, why: str) -> None:
            log.warning("watch of %s by certificate %s from %s ended: %s", kind, who, peer, why)
            fail(401, reason, f"client certificate {who} {why}")

        delay = (who.not_after - datetime.now(timezone.utc)).total_seconds()
        timer = asyncio.get_running_loop().call_later(
            max(delay, 0.0), end, "CertificateExpired",
            f"expired at {who.not_after.isoformat()}; issue a new one with `llmgw ca issue`")
        unsubscribe = self.revocations.on_revoke(
            who.serial, lambda: end("CertificateRevoked", "was revoked; ask an admin for a new one"))

        def undo() -> None:
            timer.cancel()
            unsubscribe()
        return undo


async def _hashes_redacted(chunks: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
    """The watch cache's event lines (shared by every watch of the kind) with each ApiKey's
    spec.secretHash REDACTED, for a reader who may not see them (request.py's HIDE_KEY_HASHES)."""
    async for chunk in chunks:
        lines = []
        for line in chunk.splitlines(keepends=True):
            event = json.loads(line)
            spec = event.get("object", {}).get("spec")
            if isinstance(spec, dict) and "secretHash" in spec:
                spec["secretHash"] = REDACTED
                line = (json.dumps(event) + "\n").encode()
            lines.append(line)
        yield b"".join(lines)

"""Pulls: a Model's source into the cache, one pull per source at a time, with its progress.

resolve (the listing) -> cached already? -> reserve room -> fetch each file into a partial file,
verified -> move it into a staging tree -> the content digest, checked against the pin -> commit
the tree into models/ in one rename. Nothing half-written or unverified is ever under models/, and
only models/ is handed to an engine. Shards that want the same source while it is pulled share
the pull and its progress.

With peers (llmgw/weights/peers.py), a pull is published in the node's status before its first
file, each file is tried from the peers first and from the origin last, and the files of the
pulls in flight are what the agent serves to peers pulling after it (`locate`).
"""
from __future__ import annotations

import asyncio
import errno
import logging
import os
import shutil
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Literal

import aiohttp

from llmgw.api import WeightsCache, WeightsPull
from llmgw.api.sources import PulledSource
from llmgw.weights.cache import Cache, Reservation
from llmgw.weights.digest import FileEntry, content_digest
from llmgw.weights.errors import PullError
from llmgw.weights.fetch import fetch
from llmgw.weights.peers import Peer, Peers
from llmgw.weights.resolve import HubConfig, Listing, resolve

log = logging.getLogger(__name__)


@dataclass
class Progress:
    done: int = 0
    total: int = 0
    digest: str | None = None
    resolved: str | None = None     # the source as resolved: a hub revision's commit, before any file


@dataclass(frozen=True)
class Pulled:
    digest: str
    path: Path
    resolved: str           # the source it was pulled as (hf://ORG/NAME@COMMIT, or the digest)


class Pull:
    """One source's pull in flight; `task` gives the cached model or raises PullError."""

    def __init__(self, task: asyncio.Task[Pulled], progress: Progress) -> None:
        self.task = task
        self.progress = progress


@dataclass
class Active:
    """A pull past its listing, whose verified files peers may read: partial/<key> while a file
    is fetched, then `tree`/<path> (the staging tree, and at the end the committed model)."""
    listing: Listing
    tree: Path
    started: datetime


WAIT: Literal["wait"] = "wait"      # locate: a pull in flight will fetch it, not started yet


class Puller:
    def __init__(self, cache: Cache, hub: HubConfig,
                 session: Callable[[], aiohttp.ClientSession] | None = None,
                 on_change: Callable[[], Awaitable[None]] | None = None,
                 peers: Peers | None = None) -> None:
        self.cache = cache
        self.hub = hub
        self.peers = peers
        self._session = session
        self._own: aiohttp.ClientSession | None = None
        self.on_change = on_change          # the cache's content changed (the Node's status)
        self._pulls: dict[tuple[str, str | None], Pull] = {}
        self._active: dict[str, Active] = {}
        # The files of the pulls this process completed, by expected hash: a peer that saw the pull
        # in flight (its view of the Nodes lags) still finds them.
        self._done: dict[str, Path] = {}
        self.fetched: Counter[str] = Counter()      # verified bytes fetched, by source: "peer", "origin"

    def status(self) -> WeightsCache:
        """The cache's status, with the pulls in flight peers may stream from."""
        status = self.cache.status()
        status.pulls = [WeightsPull(source=s, startedAt=a.started) for s, a in sorted(self._active.items())]
        return status

    def locate(self, key: str) -> Path | Literal["wait"] | None:
        """Where the file of expected hash `key` of a pull in flight is now (it may still grow),
        WAIT when the pull has yet to start it, None when no pull in flight has it (nor had it,
        unless the model has been evicted since)."""
        done = self._done.get(key)
        if done is not None and done.exists():
            return done
        for active in self._active.values():
            entry = next((e for e in active.listing.files if e.key == key), None)
            if entry is None:
                continue
            for where in (self.cache.partials / key, active.tree / entry.path):
                if where.exists():
                    return where
            return WAIT
        return None

    def pull(self, source: PulledSource, pin: str | None) -> Pull:
        key = (source.text, pin)
        current = self._pulls.get(key)
        if current is not None:
            return current
        progress = Progress(digest=pin)
        task = asyncio.ensure_future(self._reported(source, pin, progress))
        pull = self._pulls[key] = Pull(task, progress)
        task.add_done_callback(lambda _t: self._pulls.pop(key, None))
        return pull

    async def close(self) -> None:
        for p in list(self._pulls.values()):
            p.task.cancel()
        if self._own is not None:
            await self._own.close()
        if self.peers is not None:
            await self.peers.close()

    def _http(self) -> aiohttp.ClientSession:
        if self._session is not None:
            return self._session()
        if self._own is None or self._own.closed:
            # No total timeout: a file may take hours. A stalled read is what fails.
            self._own = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=None, sock_connect=30,
                                                                            sock_read=60))
        return self._own

    async def _reported(self, source: PulledSource, pin: str | None, progress: Progress) -> Pulled:
        """A pull, then the cache's new content told (models added or evicted, room left)."""
        try:
            return await self._pull(source, pin, progress)
        except OSError as err:
            if err.errno != errno.ENOSPC:
                raise
            raise PullError("CacheFull", f"{source.text}: the disk of {self.cache.root} is full") from None
        finally:
            await self._changed()

    async def _changed(self) -> None:
        if self.on_change is not None:
            await asyncio.shield(self.on_change())

    async def _pull(self, source: PulledSource, pin: str | None, progress: Progress) -> Pulled:
        http = self._http()
        listing = await resolve(source, http, self.hub)
        progress.resolved = listing.source
        digest = listing.digest or self.cache.digest_of(listing.source)
        if digest is not None:
            _check_pin(digest, pin, listing.source)
            progress.digest = digest
            if (cached := self.cache.take(digest)) is not None:
                progress.done = progress.total = listing.total
                return Pulled(digest, cached, listing.source)
        progress.total = listing.total
        reservation = self.cache.reserve(listing.total, {f.key for f in listing.files}, source.text)
        tree = self.cache.new_staging()
        active = Active(listing, tree, datetime.now(timezone.utc))
        try:
            if self.peers is not None:
                self._active[listing.source] = active
                await self._changed()       # published before the peers are read: see peers.py
            digest = await self._fetch_all(http, listing, active, progress, reservation)
            _check_pin(digest, pin, listing.source)
            progress.digest = digest
            path = active.tree = self.cache.commit(tree, digest, listing.source)
            self._done.update((e.key, path / e.path) for e in listing.files)
        finally:
            self._active.pop(listing.source, None)
            self.cache.release(reservation)
            shutil.rmtree(tree, ignore_errors=True)
        log.info("pulled %s: %s, %d files, %d bytes", source.text, digest, len(listing.files), listing.total)
        return Pulled(digest, path, listing.source)

    async def _fetch_all(self, http: aiohttp.ClientSession, listing: Listing, active: Active,
                         progress: Progress, reservation: Reservation) -> str:
        def advance(n: int) -> None:
            progress.done += n
            reservation.done += n
        placed: dict[str, tuple[Path, str]] = {}    # expected hash -> (where it went, its sha256)
        files = []
        failed: set[str] = set()                    # peers left for the rest of this pull
        for entry in listing.files:
            target = active.tree / entry.path
            target.parent.mkdir(parents=True, exist_ok=True)
            if entry.key in placed:         # the same bytes under two names: fetched once
                os.link(placed[entry.key][0], target)
                advance(entry.size)
            else:
                part = self.cache.partials / entry.key
                sha = await self._from_peers(listing, active, entry, part, advance, failed)
                if sha is None:
                    sha = await self._fetched("origin", part, entry.size,
                                              fetch(http, entry, part, listing.headers, advance))
                placed[entry.key] = (target, sha)
                os.rename(part, target)
            files.append((entry.path, entry.size, placed[entry.key][1]))
        return content_digest(files)

    async def _from_peers(self, listing: Listing, active: Active, entry: FileEntry, part: Path,
                          advance: Callable[[int], None], failed: set[str]) -> str | None:
        """The file from the first peer that serves it whole and verified; None: from none."""
        if self.peers is None:
            return None
        peers: list[Peer] = await self.peers.find(listing.source, listing.digest, active.started)
        for peer in peers:
            if peer.node in failed:
                continue
            counted = 0

            def count(n: int) -> None:
                nonlocal counted
                counted += n
                advance(n)
            url = peer.url(entry)
            try:
                # No origin credentials go to a peer; one attempt: the next source is there.
                return await self._fetched("peer", part, entry.size,
                                           fetch(self.peers.session(), replace(entry, url=url), part, {}, count, 1))
            except PullError as err:
                log.warning("weights from peer %s: %s; trying the next source", peer.node, err)
                failed.add(peer.node)
                advance(-counted)
                await asyncio.to_thread(part.unlink, missing_ok=True)     # none of a failed peer's bytes is kept
        return None

    async def _fetched(self, source: str, part: Path, size: int, fetching: Awaitable[str]) -> str:
        """`fetching`'s sha256, the bytes it brought counted under `source`."""
        before = await asyncio.to_thread(_size, part)
        sha = await fetching
        self.fetched[source] += size - before
        return sha


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except FileNotFoundError:
        return 0


def _check_pin(digest: str, pin: str | None, source: str) -> None:
    if pin is not None and digest != pin:
        raise PullError("DigestMismatch", f"{source} is {digest}, the Model pins {pin}")

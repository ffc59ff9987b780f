"""Pulls: a Model's source into the cache, one pull per source at a time, with its progress.

resolve (the listing) -> cached already? -> reserve room -> fetch each file into a partial file,
verified -> move it into a staging tree -> the content digest, checked against the pin -> commit
the tree into models/ in one rename. Nothing half-written or unverified is ever under models/, and
only models/ is handed to an engine. Shards that want the same source while it is pulled share
the pull and its progress.
"""
from __future__ import annotations

import asyncio
import errno
import logging
import os
import shutil
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

import aiohttp

from llmgw.api.sources import PulledSource
from llmgw.weights.cache import Cache, Reservation
from llmgw.weights.digest import content_digest
from llmgw.weights.errors import PullError
from llmgw.weights.fetch import fetch
from llmgw.weights.resolve import HubConfig, Listing, resolve

log = logging.getLogger(__name__)


@dataclass
class Progress:
    done: int = 0
    total: int = 0
    digest: str | None = None


@dataclass(frozen=True)
class Pulled:
    digest: str
    path: Path


class Pull:
    """One source's pull in flight; `task` gives the cached model or raises PullError."""

    def __init__(self, task: asyncio.Task[Pulled], progress: Progress) -> None:
        self.task = task
        self.progress = progress


class Puller:
    def __init__(self, cache: Cache, hub: HubConfig,
                 session: Callable[[], aiohttp.ClientSession] | None = None,
                 on_change: Callable[[], Awaitable[None]] | None = None) -> None:
        self.cache = cache
        self.hub = hub
        self._session = session
        self._own: aiohttp.ClientSession | None = None
        self.on_change = on_change          # the cache's content changed (the Node's status)
        self._pulls: dict[tuple[str, str | None], Pull] = {}

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
            if self.on_change is not None:
                await asyncio.shield(self.on_change())

    async def _pull(self, source: PulledSource, pin: str | None, progress: Progress) -> Pulled:
        http = self._http()
        listing = await resolve(source, http, self.hub)
        digest = listing.digest or self.cache.digest_of(listing.source)
        if digest is not None:
            _check_pin(digest, pin, listing.source)
            progress.digest = digest
            if self.cache.has(digest):
                self.cache.touch(digest)
                progress.done = progress.total = listing.total
                return Pulled(digest, self.cache.path(digest))
        progress.total = listing.total
        reservation = self.cache.reserve(listing.total, {f.key for f in listing.files}, source.text)
        tree = self.cache.new_staging()
        try:
            digest = await self._fetch_all(http, listing, tree, progress, reservation)
            _check_pin(digest, pin, listing.source)
            progress.digest = digest
            path = self.cache.commit(tree, digest, listing.source)
        finally:
            self.cache.release(reservation)
            shutil.rmtree(tree, ignore_errors=True)
        log.info("pulled %s: %s, %d files, %d bytes", source.text, digest, len(listing.files), listing.total)
        return Pulled(digest, path)

    async def _fetch_all(self, http: aiohttp.ClientSession, listing: Listing, tree: Path,
                         progress: Progress, reservation: Reservation) -> str:
        def advance(n: int) -> None:
            progress.done += n
            reservation.done += n
        placed: dict[str, tuple[Path, str]] = {}    # expected hash -> (where it went, its sha256)
        files = []
        for entry in listing.files:
            target = tree / entry.path
            target.parent.mkdir(parents=True, exist_ok=True)
            if entry.key in placed:         # the same bytes under two names: fetched once
                os.link(placed[entry.key][0], target)
                advance(entry.size)
            else:
                part = self.cache.partials / entry.key
                placed[entry.key] = (target, await fetch(http, entry, part, listing.headers, advance))
                os.rename(part, target)
            files.append((entry.path, entry.size, placed[entry.key][1]))
        return content_digest(files)


def _check_pin(digest: str, pin: str | None, source: str) -> None:
    if pin is not None and digest != pin:
        raise PullError("DigestMismatch", f"{source} is {digest}, the Model pins {pin}")

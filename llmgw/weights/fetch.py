"""One file from its origin into the cache's partial file, resumed and verified.

A file is written under `partial/<its expected hash>` only; the puller moves it into the model's
tree once its size and hash are the listing's. A partial file left by an interrupted fetch (a
dropped connection, an agent restart) is resumed with a range request after its bytes so far are
hashed again; an origin that answers a range with the whole file (200) is read from the start.
A connection that drops is retried, from where it stopped, with the one backoff policy.
"""
from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

import aiohttp

from llmgw.backoff import Backoff
from llmgw.weights.digest import FileEntry, Hashes
from llmgw.weights.errors import PullError

log = logging.getLogger(__name__)

CHUNK = 1 << 20
ATTEMPTS = 5           # connections per file that may drop before the pull fails


async def fetch(http: aiohttp.ClientSession, entry: FileEntry, part: Path, headers: dict[str, str],
                progress: Callable[[int], None], attempts: int = ATTEMPTS) -> str:
    """Fetch `entry` into `part` (resuming what is there); its sha256 once verified.
    `progress(n)` is told each n bytes that reach the file (the resumed prefix too)."""
    backoff = Backoff(0.2, 5.0)
    while True:
        try:
            return await _attempt(http, entry, part, headers, progress)
        except (aiohttp.ClientError, asyncio.TimeoutError, ConnectionError) as err:
            if backoff.failures + 1 >= attempts:
                raise PullError("OriginUnreachable", f"{entry.url}: {type(err).__name__}: {err} "
                                f"({attempts} attempts)") from None
            log.warning("%s: %s: %s; resuming", entry.url, type(err).__name__, err)
            await backoff.sleep()


async def _attempt(http: aiohttp.ClientSession, entry: FileEntry, part: Path, headers: dict[str, str],
                   progress: Callable[[int], None]) -> str:
    hashes = Hashes(entry)
    have = await asyncio.to_thread(_rehash, part, entry.size, hashes)
    progress(have)
    if have == entry.size:
        return _verified(hashes, part)
    request = {**headers, **({"range": f"bytes={have}-"} if have else {})}
    async with http.get(entry.url, headers=request) as resp:
        if resp.status == 404:
            raise PullError("SourceNotFound", f"{entry.url}: 404 Not Found")
        if resp.status not in (200, 206):
            raise PullError("OriginUnreachable", f"{entry.url}: HTTP {resp.status}")
        if resp.status == 200 and have:        # the origin ignored the range: start again
            progress(-have)
            hashes, have = Hashes(entry), 0
        with part.open("ab" if have else "wb") as f:
            # Written a CHUNK at a time: one hop to a thread per MiB, not per TLS record (a few KiB);
            # the chunks as they came, never copied into one buffer.
            pending: list[bytes] = []
            try:
                async for chunk in resp.content.iter_chunked(CHUNK):
                    if have + _sum(pending) + len(chunk) > entry.size:
                        pending.clear()
                        f.close()
                        await asyncio.to_thread(part.unlink, missing_ok=True)
                        raise PullError("ChecksumMismatch", f"{entry.path}: the origin sent more than its "
                                        f"{entry.size} bytes")
                    pending.append(chunk)
                    if _sum(pending) >= CHUNK:
                        have += await _flush(f, hashes, pending, progress)
            finally:
                if pending:     # what came before a dropped connection is kept, to resume from
                    have += await _flush(f, hashes, pending, progress)
    if have != entry.size:      # the body ended early without an error from the connection
        raise aiohttp.ClientPayloadError(f"{entry.path}: {have} of {entry.size} bytes")
    return _verified(hashes, part)


def _rehash(part: Path, size: int, hashes: Hashes) -> int:
    """Hash what a partial file holds; a file longer than the listing's is dropped."""
    try:
        have = part.stat().st_size
    except FileNotFoundError:
        return 0
    if have > size:
        part.unlink()
        return 0
    with part.open("rb") as f:
        for chunk in iter(lambda: f.read(CHUNK), b""):
            hashes.update(chunk)
    return have


def _sum(chunks: list[bytes]) -> int:
    return sum(map(len, chunks))


async def _flush(f: BinaryIO, hashes: Hashes, pending: list[bytes], progress: Callable[[int], None]) -> int:
    chunks = pending[:]
    pending.clear()
    await asyncio.to_thread(_write, f, hashes, chunks)
    n = _sum(chunks)
    progress(n)
    return n


def _write(f: BinaryIO, hashes: Hashes, chunks: list[bytes]) -> None:
    for chunk in chunks:
        f.write(chunk)
        hashes.update(chunk)


def _verified(hashes: Hashes, part: Path) -> str:
    wrong = hashes.mismatch()
    if wrong is not None:
        with contextlib.suppress(FileNotFoundError):
            part.unlink()           # bad bytes are never resumed from
        raise PullError("ChecksumMismatch", wrong)
    return hashes.sha256.hexdigest()

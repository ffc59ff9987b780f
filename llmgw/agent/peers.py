"""This node's weights cache, served read-only to the other nodes (docs/contracts.md, "Weights").

    GET /weights/models/<hex>/<path>       a file of a whole model in the cache (Range: resumed)
    GET /weights/files/<key>?size=N        a file of a pull in flight, by its expected hash
                                           (llmgw/weights/digest.py FileEntry.key), sent as it is
                                           written, to its N bytes

On the agent's TLS listener (--logs-listen, its Node's status.agentEndpoint), to node
certificates of the cluster's CA (O=llmgw:nodes) alone. There are GET routes only (HEAD with
them): no request of a peer writes, deletes or starts anything here; a PUT, POST or DELETE is
405. What a peer reads it verifies itself (size and sha256), so a byte this node serves wrong
costs the peer a fetch from elsewhere, never a bad file.
"""
from __future__ import annotations

import asyncio
import logging
import os
import re
from collections.abc import Callable
from typing import Any

from aiohttp import web

from llmgw.agent.listener import STILL_TRUSTED, only
from llmgw.pki.ca import ORG
from llmgw.weights.digest import check_path
from llmgw.weights.puller import WAIT, Puller

log = logging.getLogger(__name__)

NODE_ORG = ORG["node"]
CHUNK = 1 << 20
POLL = 0.02                    # seconds between looks at a file still being written
STALL = 20.0                   # seconds a file of a pull in flight may not grow before the answer ends short
_HEX = re.compile(r"[0-9a-f]{64}")
_KEY = re.compile(r"(sha256-[0-9a-f]{64}|gitsha1-[0-9a-f]{40})")


class CacheServer:
    def __init__(self, puller: Puller) -> None:
        self.puller = puller

    def app(self) -> web.Application:
        app = web.Application(middlewares=[only(NODE_ORG, "weights request", lambda cn, org: (
            f"only nodes (O={NODE_ORG}) read a node's weights cache; CN={cn} O={org} may not"))])
        app.router.add_get("/models/{hex}/{path:.+}", self.model_file)
        app.router.add_get("/files/{key}", self.pulling_file)
        return app

    async def model_file(self, request: web.Request) -> web.StreamResponse:
        hexdigest, path = request.match_info["hex"], request.match_info["path"]
        try:
            if not _HEX.fullmatch(hexdigest):
                raise ValueError(f"{hexdigest!r} is not a content digest's 64 hex digits")
            check_path(path)
        except ValueError as err:
            raise web.HTTPBadRequest(text=str(err)) from None
        file = self.puller.cache.path("sha256:" + hexdigest) / path
        if not file.is_file():
            raise web.HTTPNotFound(text=f"no {path} of sha256:{hexdigest} in this node's cache")
        return web.FileResponse(file)       # Range included

    async def pulling_file(self, request: web.Request) -> web.StreamResponse:
        key = request.match_info["key"]
        try:
            if not _KEY.fullmatch(key):
                raise ValueError(f"{key!r} is not a file's expected hash (sha256-<64 hex> or gitsha1-<40 hex>)")
            size = int(request.query.get("size", ""))
            start = _range_start(request.headers.get("Range"))
        except ValueError as err:
            raise web.HTTPBadRequest(text=str(err)) from None
        f = await self._open(key)
        try:
            # Chunked, no length: an answer that ends short (the file stalled or was dropped as
            # wrong) is one the peer's fetch sees as short, and it goes elsewhere.
            resp = web.StreamResponse(status=206 if start else 200)
            await resp.prepare(request)
            await _follow(f, start, size, resp, request[STILL_TRUSTED])
            await resp.write_eof()
            return resp
        finally:
            f.close()

    async def _open(self, key: str) -> Any:
        """The file of `key` opened, waiting while the pull in flight has yet to start it."""
        waited = 0.0
        while True:
            where = self.puller.locate(key)
            if where is None or waited > STALL:
                raise web.HTTPNotFound(text=f"no pull in flight on this node has {key}")
            if where != WAIT:
                try:
                    return open(where, "rb")  # noqa: ASYNC230 a local file, closed by the caller
                except FileNotFoundError:
                    pass            # moved between the look and the open (into the tree): look again
            await asyncio.sleep(POLL)
            waited += POLL


async def _follow(f: Any, start: int, size: int, resp: web.StreamResponse, trusted: Callable[[], bool]) -> None:
    """Send `f` from `start` to `size` bytes as it grows; stop short when it stops growing for
    STALL seconds or is removed (its pull dropped it, or failed), or when the peer's certificate
    is revoked (`trusted()` false: a pull in progress is cut within the revocation watch's delay)."""
    f.seek(start)
    sent, idle = start, 0.0
    while sent < size:
        if not trusted():
            log.warning("a peer's read of %s ends at %d of %d bytes: its certificate is revoked (or the revoked "
                        "certificates are no longer known)", f.name, sent, size)
            return
        chunk = await asyncio.to_thread(f.read, min(CHUNK, size - sent))
        if chunk:
            await resp.write(chunk)
            sent += len(chunk)
            idle = 0.0
            continue
        if os.fstat(f.fileno()).st_nlink == 0 or idle > STALL:
            log.warning("a peer's read of %s ends at %d of %d bytes: the file %s", f.name, sent, size,
                        "was removed" if idle <= STALL else f"did not grow for {STALL:.0f} s")
            return
        await asyncio.sleep(POLL)
        idle += POLL


def _range_start(header: str | None) -> int:
    if header is None:
        return 0
    m = re.fullmatch(r"bytes=(\d+)-", header.strip())
    if m is None:
        raise ValueError(f"Range {header!r}: only bytes=N- is served")
    return int(m.group(1))

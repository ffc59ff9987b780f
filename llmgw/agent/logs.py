"""This node's engine logs, served to the API server over HTTPS (`llmgw logs`; docs/contracts.md,
"Engine logs").

    GET /shards/<shard>/log?tail=N&follow=1&previous=1&command=C     (llmgw.api.logs.LogQuery)

Mutual TLS with the node's own certificate, on the agent's listener (which also serves its weights
cache to peers, llmgw/agent/peers.py): the agent answers the API server alone (a client
certificate of the cluster CA with O=llmgw:servers), which authorizes the caller and proxies
the answer; any other certificate, another node's included, is refused (403). Logs live in the
state directory (llmgw.agent.state): the shard's latest run, and the run before it, so a
crashed engine's log stays readable after its shard is rebuilt.
"""
from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Callable
from pathlib import Path
from typing import IO

from aiohttp import web

from llmgw.agent.listener import only
from llmgw.agent.state import StateDir
from llmgw.api.logs import MAX_LOG_BYTES, LogQuery
from llmgw.api.meta import check_dns1123_label
from llmgw.pki.ca import ORG

log = logging.getLogger(__name__)

SERVER_ORG = ORG["server"]
CHUNK = 64 * 1024
FOLLOW_POLL = 0.2              # how often a followed log is read for what was appended


def read_end(f: IO[bytes], tail: int | None) -> bytes:
    """The end of an open log, its last `tail` lines (all when None), at most MAX_LOG_BYTES starting
    at a line; leaves `f` at its end, where following carries on."""
    size = f.seek(0, os.SEEK_END)
    start = max(0, size - MAX_LOG_BYTES)
    f.seek(start)
    data = f.read(size - start)
    if start > 0 and b"\n" in data:
        data = data[data.index(b"\n") + 1:]      # a cut line is no line
    if tail is not None:
        data = b"".join(data.splitlines(keepends=True)[-tail:]) if tail else b""
    return data


def _gone(request: web.Request) -> bool:
    return request.transport is None or request.transport.is_closing()


class LogServer:
    """`running(shard)`: whether the shard's engine runs now (a follow ends when it stops)."""

    def __init__(self, state: StateDir, running: Callable[[str], bool]):
        self.state = state
        self.running = running

    def app(self) -> web.Application:
        """Its routes, under /shards/ of the agent's listener."""
        app = web.Application(middlewares=[only(SERVER_ORG, "log request", lambda cn, org: (
            f"only the API server (O={SERVER_ORG}) reads engine logs from an agent; CN={cn} O={org} may not: "
            "ask the API server (`llmgw logs`)"))])
        app.router.add_get("/{name}/log", self.shard_log)
        return app

    async def shard_log(self, request: web.Request) -> web.StreamResponse:
        name = request.match_info["name"]
        try:
            check_dns1123_label(name)
            query = LogQuery.parse(request.query)
        except ValueError as err:
            raise web.HTTPBadRequest(text=str(err)) from None
        path = self._path(name, query)
        with open(path, "rb") as f:  # noqa: ASYNC230 a local file, read in bounded pieces
            resp = web.StreamResponse(headers={"Content-Type": "text/plain; charset=utf-8"})
            await resp.prepare(request)
            try:
                await resp.write(read_end(f, query.tail))
                if query.follow:
                    await self._follow(request, resp, f, path, name)
            except ConnectionError:
                pass   # the API server (its client) went away
        return resp

    def _path(self, shard: str, query: LogQuery) -> Path:
        logs = self.state.logs_of(shard, previous=query.previous)
        which = "previous run" if query.previous else "engine"
        if not logs:
            raise web.HTTPNotFound(text=f"no {which} log of shard {shard} on this node")
        if query.command is not None:
            if query.command not in logs:
                raise web.HTTPNotFound(text=f"shard {shard} has no {which} log of command {query.command} "
                                            f"(it has: {', '.join(logs)})")
            return logs[query.command]
        if len(logs) > 1:
            raise web.HTTPBadRequest(text=f"shard {shard} runs several commands: choose one of "
                                          f"{', '.join(logs)} (--command)")
        return next(iter(logs.values()))

    async def _follow(self, request: web.Request, resp: web.StreamResponse, f: IO[bytes], path: Path,
                      shard: str) -> None:
        """What the engine appends, until its run ends (it stopped, or a new run took the file's
        name) or the client goes. `f` stays open: a renamed log is still read to its end."""
        inode = os.fstat(f.fileno()).st_ino
        while not _gone(request):
            running = self.running(shard)    # asked before the read: what it wrote before it ended is sent
            while chunk := f.read(CHUNK):
                await resp.write(chunk)
            try:
                replaced = os.stat(path).st_ino != inode
            except FileNotFoundError:
                replaced = True
            if not running or replaced:
                while chunk := f.read(CHUNK):
                    await resp.write(chunk)
                return
            await asyncio.sleep(FOLLOW_POLL)

"""Peers before the origin: the other nodes a pull may fetch a file from, best first.

Every agent serves its cache read-only to the other nodes over mutual TLS with its node
certificate (llmgw/agent/peers.py, at its Node's status.agentEndpoint). Before each file a pulling
agent asks the server which Nodes hold or pull what it pulls (`nodes?weights=SOURCE&digest=D`,
answered from the server's index, llmgw/server/weightsindex.py, not from a list of the fleet), and
tries, in order:

1. nodes that hold the whole content (its digest, or a source resolved to it), those that share
   a fabric with this node first; each group rotated by this node's name, so a fleet spreads its
   reads over the holders;
2. nodes pulling the same source that started before this one (status.weights.pulls), the latest
   first: each streams the file as that node writes it, so a fleet pulling at once forms a chain
   and the first of it alone reads the origin;
3. the origin.

A peer's bytes are verified as the origin's are (size and sha256); a peer that fails (refuses,
drops, stalls, serves a wrong byte) is left for the rest of the pull and the next source is
tried from the file's start, so a peer's bad byte never meets the origin's.
"""
from __future__ import annotations

import logging
import ssl
import zlib
from collections.abc import Awaitable, Callable
from collections.abc import Set as AbstractSet
from dataclasses import dataclass
from datetime import datetime
from urllib.parse import quote

import aiohttp

from llmgw.api import Node
from llmgw.weights.digest import FileEntry

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Peer:
    node: str
    endpoint: str            # https://ADDR:PORT, its agent's listener
    digest: str | None       # the content is whole in its cache as this digest; None: it is pulling it

    def url(self, entry: FileEntry) -> str:
        if self.digest is not None:
            return f"{self.endpoint}/weights/models/{self.digest.removeprefix('sha256:')}/{quote(entry.path)}"
        return f"{self.endpoint}/weights/files/{entry.key}?size={entry.size}"


def choose(nodes: list[Node], me: str, fabrics: AbstractSet[str], source: str, digest: str | None,
           started: datetime) -> list[Peer]:
    """The peers to try for a pull of `source` (its content `digest` when known) that this node,
    `me` on `fabrics`, began at `started`, best first."""
    holders: list[tuple[bool, int, str, Peer]] = []
    pulling: list[tuple[datetime, str, Peer]] = []
    for n in nodes:
        w, endpoint = n.status.weights, n.status.agentEndpoint
        if n.name == me or w is None or endpoint is None:
            continue
        held = next((m.digest for m in w.models if m.digest in (source, digest) or source in m.sources), None)
        if held is not None:
            near = bool(fabrics & {f.name for f in n.status.fabrics})
            spread = zlib.crc32(f"{me}/{n.name}".encode())
            holders.append((not near, spread, n.name, Peer(n.name, endpoint, held)))
            continue
        for p in w.pulls:
            if p.source == source and (p.startedAt, n.name) < (started, me):
                pulling.append((p.startedAt, n.name, Peer(n.name, endpoint, None)))
    return [h[-1] for h in sorted(holders)] + [p[-1] for p in sorted(pulling, reverse=True)]


class Peers:
    """The other nodes, as a pull sees them: `nodes(source, digest)` gives the Nodes that hold or
    pull `source`, or hold the content `digest` (the agent's client asks the server); `fabrics()`
    this node's fabrics (its own Node may not be among those Nodes yet); `tls` is the node's own
    certificate and the cluster's CA."""

    def __init__(self, me: str, fabrics: Callable[[], AbstractSet[str]],
                 nodes: Callable[[str, str | None], Awaitable[list[Node]]], tls: ssl.SSLContext) -> None:
        self.me = me
        self._fabrics = fabrics
        self._nodes = nodes
        self._tls = tls
        self._session: aiohttp.ClientSession | None = None

    async def find(self, source: str, digest: str | None, started: datetime) -> list[Peer]:
        try:
            nodes = await self._nodes(source, digest)
        except Exception as err:  # noqa: BLE001 whatever keeps the Nodes from us, the origin still serves
            log.warning("cannot ask for the nodes to find peers holding %s, fetching from the origin: %s", source, err)
            return []
        return choose(nodes, self.me, self._fabrics(), source, digest, started)

    def session(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            # A peer that stalls is left soon: the origin, or another peer, is there.
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(ssl=self._tls),
                timeout=aiohttp.ClientTimeout(total=None, sock_connect=5, sock_read=30))
        return self._session

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()

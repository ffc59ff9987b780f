"""A node's heartbeat, a lease of `ttl` seconds on a registered Node: `POST /heartbeat/<node>`, one
beat a request, or `GET /heartbeat/<node>` upgraded to a WebSocket, one beat a message on one
connection (what llmgw.client sends: no HTTP request, pipeline or TLS record of headers per beat).

A message is a beat's body (`{}`, `{"ttl": n}`); its answer is the POST's (`{"node", "ttl"}`), or
the Status of its refusal (`{"code", "reason", "message"}`), after which the stream goes on; a
certificate revoked or expired while the stream is open is refused (401) and the stream closed.
A server that is stopped closes every stream at once (1001, going away): its agents' next beat
goes to the next server.

What a beat costs the server is its place in the next write of the store's heartbeats (llmgw/
store/leases.py: the beats of a window bound to one new lease by one transaction, no etcd
request of its own): whether the Node is registered is answered from the names of the Nodes'
keys, which a watch keeps (nothing decoded); a name the watch has not shown yet (a Node just
created, the watch not listed yet) is asked of etcd, its key alone. A Node deleted may still be beaten for
as long as the watch trails the delete.
"""
from __future__ import annotations

import asyncio
import json
from typing import Any

from aiohttp import WSCloseCode, WSMsgType, web

from llmgw.api.client import EventType
from llmgw.api.errors import BadRequest, CertificateExpired, CertificateRevoked, NotFound, StatusError
from llmgw.api.limits import HEARTBEAT_TTL, MAX_TTL, parse_json
from llmgw.backoff import Backoff
from llmgw.pki import Identity
from llmgw.reflector import Reflector
from llmgw.server.metrics import ServerMetrics
from llmgw.server.request import json_response, read_body
from llmgw.server.revocations import Revocations
from llmgw.server.status import status_body
from llmgw.store import Store
from llmgw.store.listwatch import after_store_error_never_raise


class Heartbeats:
    def __init__(self, store: Store, revocations: Revocations, metrics: ServerMetrics,
                 ttl: int = HEARTBEAT_TTL) -> None:
        self.store = store
        self.ttl = ttl          # a beat's that names none (`llmgw server --heartbeat-ttl`)
        self.revocations = revocations
        self.metrics = metrics      # each beat of a stream counted as a POST's answer is
        self._nodes: set[str] = set()      # the registered Nodes' names, as the watch has them
        self._task: asyncio.Task[None] | None = None
        self._reflector = Reflector(store.heartbeats.nodes_lister_watcher(after_store_error_never_raise),
                                    self._change, key=str, known=lambda: self._nodes, backoff=Backoff(0.1, 5.0),
                                    burst=256, name="registered nodes")
        self._streams: set[web.WebSocketResponse] = set()

    async def beat(self, request: web.Request) -> web.Response:
        body = await read_body(request) if request.can_read_body else {}
        node = request.match_info["node"]
        return json_response({"node": node, "ttl": await self._beat(node, body)})

    async def stream(self, request: web.Request) -> web.StreamResponse:
        node, who = request.match_info["node"], request["identity"]
        ws = web.WebSocketResponse(max_msg_size=4096)
        await ws.prepare(request)
        self._streams.add(ws)
        # each ttl's answer encoded once: a fleet's beats are a server's most frequent messages
        # (hack/bench/failover.py's heartbeat_cpu_ms)
        answers: dict[int, str] = {}     # ttl -> the answer's text
        try:
            async for msg in ws:
                if msg.type != WSMsgType.TEXT:
                    break
                try:
                    self._still_valid(who)
                    ttl = await self._beat(node, _body(msg.data))
                except (CertificateRevoked, CertificateExpired) as err:
                    self.metrics.observe("heartbeat", "heartbeat", err.code)
                    await ws.send_str(json.dumps(status_body(err.code, err.reason, str(err))))
                    break
                except StatusError as err:
                    self.metrics.observe("heartbeat", "heartbeat", err.code)
                    await ws.send_str(json.dumps(status_body(err.code, err.reason, str(err), **err.details)))
                    continue
                self.metrics.observe("heartbeat", "heartbeat", 200)
                text = answers.get(ttl)
                if text is None:
                    text = answers[ttl] = json.dumps({"node": node, "ttl": ttl})
                await ws.send_str(text)
        finally:
            self._streams.discard(ws)
            await ws.close()
        return ws

    def _still_valid(self, who: Identity) -> None:
        if who.serial in self.revocations:
            raise CertificateRevoked(f"client certificate {who} was revoked; ask an admin for a new one")
        if who.expired():
            raise CertificateExpired(f"client certificate {who} expired at {who.not_after.isoformat()}; "
                                     "issue a new one with `llmgw ca issue`")

    async def _beat(self, node: str, body: dict[str, Any]) -> int:
        """Beat for `node` as `body` asks: the ttl written."""
        ttl = body.get("ttl")
        if ttl is None:   # absent or null: the default
            ttl = self.ttl
        if not isinstance(ttl, int) or isinstance(ttl, bool) or not 1 <= ttl <= MAX_TTL:
            raise BadRequest(f"ttl must be an integer number of seconds in 1..{MAX_TTL}, got {ttl!r}")
        if self._task is None:
            self._task = asyncio.create_task(self._reflector.run())
        # a heartbeat is of a registered Node
        if node not in self._nodes and not await self.store.heartbeats.node_registered(node):
            raise NotFound(f"nodes/{node} not found")
        await self.store.heartbeats.beat(node, ttl=ttl)
        return ttl

    def _change(self, type_: EventType, node: str, revision: int) -> None:
        if type_ == "DELETED":
            self._nodes.discard(node)
        else:
            self._nodes.add(node)

    async def drain(self) -> None:
        """The server is stopping: every stream closed now, so its agents beat the next server."""
        await asyncio.gather(*(ws.close(code=WSCloseCode.GOING_AWAY, message=b"the server is shutting down")
                               for ws in list(self._streams)), return_exceptions=True)

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)


def _body(text: str) -> dict[str, Any]:
    """A message's beat: a JSON object within the API's limits, or BadRequest."""
    if text == "{}":   # what an agent sends (no ttl of its own): nothing to parse
        return {}
    try:
        body = parse_json(text) if text.strip() else {}
    except ValueError as err:   # InputError is one
        raise BadRequest(f"a beat: {err}") from None
    if not isinstance(body, dict):
        raise BadRequest("a beat is a JSON object")
    return body

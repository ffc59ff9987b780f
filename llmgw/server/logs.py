"""Engine logs through the API (`llmgw logs`): the server dials the agent of the shard's node and
relays what it answers (docs/contracts.md, "Engine logs").

The agent is found at its Node's ``status.agentEndpoint`` and reached over mutual TLS: the
server presents its own certificate, and the agent's must be signed by the cluster CA, be a
node's (O=llmgw:nodes), carry the node's name as CN and not be revoked; the host name is not
what is trusted (as the API server trusts a kubelet by its node's name).
"""
from __future__ import annotations

import asyncio
import contextlib
import ssl
from collections.abc import AsyncIterator, Callable
from contextvars import ContextVar

import aiohttp
from aiohttp.client_proto import ResponseHandler
from aiohttp.client_reqrep import ClientRequest
from aiohttp.tracing import Trace

from llmgw.api import Node
from llmgw.api.errors import BadRequest, NotFound, StatusError, Unavailable
from llmgw.api.logs import LogQuery
from llmgw.pki import identity_from_der

CONNECT_TIMEOUT = 5.0


# What an agent's refusal means to the caller: its words, under the API's error contract.
_AGENT_ERRORS: dict[int, type[StatusError]] = {400: BadRequest, 404: NotFound}


class AgentLogs:
    """`revoked(serial)`: whether a certificate serial is revoked (the server's revocation set)."""

    def __init__(self, tls: ssl.SSLContext | None, revoked: Callable[[str], bool]):
        self.tls = tls
        self.revoked = revoked
        self._session: aiohttp.ClientSession | None = None

    def _open(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            assert self.tls is not None  # open() refuses first
            timeout = aiohttp.ClientTimeout(total=None, sock_connect=CONNECT_TIMEOUT)
            self._session = aiohttp.ClientSession(connector=_AgentConnector(self.tls, self.revoked), timeout=timeout)
        return self._session

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()

    @contextlib.asynccontextmanager
    async def open(self, node: Node, shard: str, query: LogQuery) -> AsyncIterator[AsyncIterator[bytes]]:
        """The log as the agent of `node` sends it, once the agent has answered. Raises NotFound or
        BadRequest with the agent's words, Unavailable when it cannot be reached or trusted."""
        endpoint = node.status.agentEndpoint
        if self.tls is None:
            raise Unavailable("this API server was started without a certificate to dial agents with")
        if not endpoint:
            raise Unavailable(f"node {node.name} serves no engine logs: its agent runs without --logs-listen")
        url = f"{endpoint}/shards/{shard}/log"
        _NODE.set(node.name)
        try:
            resp = await self._open().get(url, params=query.params())
        except (aiohttp.ClientError, OSError, asyncio.TimeoutError) as err:
            raise Unavailable(f"cannot reach the agent of node {node.name} at {endpoint}: "
                              f"{err or type(err).__name__}") from None
        try:
            if resp.status != 200:
                text = (await resp.text())[:2000]
                raise _AGENT_ERRORS.get(resp.status, Unavailable)(
                    f"the agent of node {node.name} answered {resp.status}: {text}")
            yield _chunks(resp)
        finally:
            resp.close()



# The node whose agent the current task dials (AgentLogs.open sets it; _AgentConnector checks it).
_NODE: ContextVar[str] = ContextVar("agent_node")


class _AgentConnector(aiohttp.TCPConnector):
    """Dials agents: a new connection for every request (nothing pooled under an address that
    another node may advertise next), trusted only once its certificate is the node's, before
    the request is sent."""

    def __init__(self, tls: ssl.SSLContext, revoked: Callable[[str], bool]):
        super().__init__(ssl=tls, force_close=True)
        self._revoked = revoked

    async def _create_connection(self, req: ClientRequest, traces: list[Trace],
                                 timeout: aiohttp.ClientTimeout) -> ResponseHandler:
        proto = await super()._create_connection(req, traces, timeout)
        ssl_obj = proto.transport.get_extra_info("ssl_object") if proto.transport is not None else None
        der = ssl_obj.getpeercert(binary_form=True) if ssl_obj is not None else None
        who, node, where = identity_from_der(der) if der else None, _NODE.get(), req.url.origin()
        why = None
        if who is None or who.role != "node" or who.name != node:
            why = f"{where} is not the agent of node {node}: its certificate is {who or 'missing'}, " \
                  f"not CN={node} O=llmgw:nodes"
        elif self._revoked(who.serial):
            why = f"the agent of node {node} at {where} presents a revoked certificate ({who})"
        if why is not None:
            proto.close()
            raise Unavailable(why)
        return proto


async def _chunks(resp: aiohttp.ClientResponse) -> AsyncIterator[bytes]:
    """The body as it comes; an agent that drops the stream ends the log (its answer has begun)."""
    try:
        async for chunk in resp.content.iter_any():
            yield chunk
    except (aiohttp.ClientError, OSError, asyncio.TimeoutError):
        return

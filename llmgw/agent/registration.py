"""The agent's Node: register it, keep its status current, heartbeat.

Registration heartbeats, creates the Node if it does not exist, then patches its status
(top-level fields; conditions merged by type, so the node-lifecycle
controller's own conditions survive). Ready=True (reason AgentReady) is set
when the agent (re)registers: after start, and after every outage.
"""
from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from tenacity import AsyncRetrying, RetryCallState, retry_if_exception_type, retry_if_not_exception_type

from llmgw.api import NODE_AGENT_STATUS_FIELDS, Node, NodeStatus, ObjectMeta, set_condition
from llmgw.api.errors import AlreadyExists, NotFound, VersionSkew
from llmgw.api.limits import HEARTBEAT_TTL, heartbeat_window
from llmgw.backoff import Backoff, ExponentialJitter
from llmgw.client import Client

log = logging.getLogger(__name__)
T = TypeVar("T")
KEY_MARGIN = 1.0   # s before the heartbeat key expires that a beat opening a new connection must be answered by

def status_patch(status: NodeStatus, ready: bool) -> dict[str, Any]:
    conds = [c.model_copy() for c in status.conditions]
    if ready:
        set_condition(conds, "Ready", "True", "AgentReady", "the agent registered and is heartbeating")
    data = status.model_copy(update={"conditions": conds}).model_dump(mode="json")
    # A field left out at its default (api.meta.added) is sent as null: the merge patch clears it.
    return {k: data.get(k) for k in NODE_AGENT_STATUS_FIELDS}


def _log_retry(what: str) -> Callable[[RetryCallState], None]:
    def before_sleep(state: RetryCallState) -> None:
        err = state.outcome.exception() if state.outcome is not None else None
        log.warning("%s failed (attempt %d), retrying in %.1f s: %s", what, state.attempt_number,
                    state.next_action.sleep if state.next_action else 0, err)
    return before_sleep


async def retry_forever(what: str, fn: Callable[[], Awaitable[T]], max_wait: float = 10.0) -> T:
    """Await fn() until it succeeds, with jittered exponential backoff between tries; but a
    VersionSkew, which no retry cures (this agent's version is outside the server's policy), is raised."""
    async for attempt in AsyncRetrying(
        wait=ExponentialJitter(0.2, max_wait),
        retry=retry_if_exception_type(Exception) & retry_if_not_exception_type(VersionSkew),
        before_sleep=_log_retry(what),
        reraise=True,
    ):
        with attempt:
            return await fn()
    raise AssertionError("unreachable: AsyncRetrying retries forever and reraises")


class Registration:
    def __init__(self, client: Client, node: str, labels: dict[str, str] | None = None,
                 heartbeat_interval: float = 5.0):
        self.client = client
        self.node = node
        self.labels = dict(labels or {})
        self.interval = heartbeat_interval
        self.status: NodeStatus | None = None
        self.connected = asyncio.Event()     # set while heartbeats succeed
        self.on_reconnect: list[Callable[[], None]] = []  # callbacks run after an outage ends
        self._sent: dict[str, Any] | None = None

    async def register(self, status: NodeStatus) -> None:
        """Create the Node if needed and send its status; retried until it works."""
        self.status = status
        await retry_forever(f"registering node {self.node}", self._register_once)
        self.connected.set()
        log.info("node %s registered with %d GPUs, fabrics %s, engines %s", self.node, len(status.gpus),
                 [f.name for f in status.fabrics] or "none (island)", [e.name for e in status.engines])

    async def _register_once(self) -> None:
        # The Node first: the server takes heartbeats of registered Nodes only. Until its first
        # heartbeat, a Node that never reported Ready is registering, not silent, to the
        # node-lifecycle controller (no NotReady flap).
        try:
            await self.client.get(Node, self.node)
        except NotFound:
            try:
                await self.client.create(Node(metadata=ObjectMeta(name=self.node, labels=self.labels)))
            except AlreadyExists:
                pass
        await self.client.heartbeat(self.node)
        await self._send(force=True)

    async def _send(self, force: bool = False) -> None:
        assert self.status is not None  # set by register
        patch = status_patch(self.status, ready=True)
        if not force and patch == self._sent:
            return
        await self.client.patch_status(Node, self.node, patch)
        self._sent = patch

    async def update_status(self, status: NodeStatus) -> None:
        """Rediscovery changed something: send it (only if it differs from what was sent)."""
        self.status = status
        if self.connected.is_set():
            try:
                await self._send()
            except Exception as err:  # noqa: BLE001 whatever failed, resend once reconnected
                log.warning("node %s: status update failed, will resend when reconnected: %s", self.node, err)
                self.connected.clear()

    async def heartbeat_loop(self) -> None:
        """Heartbeat every interval; after a failure, back off, and re-register once it works.
        Each server may take the interval to answer, and the window in which it gathers beats before
        it writes them (a frozen one: the next), but a beat that opens
        a new connection (a failover) may take until its key is about to expire, and once the key
        has expired, the client's timeout (as the first beat): under a fleet's reconnections at once
        the handshake is finished rather than redone elsewhere, which would only add to the herd
        (hack/bench/failover.py: beats abandoned after the interval were tried 17 times each)."""
        backoff = Backoff(0.2, self.interval)
        loop = asyncio.get_running_loop()
        alive_until = 0.0    # the event loop's clock, when the key of the last beat answered expires
        ttl: float = HEARTBEAT_TTL   # the last answer's: the server's (--heartbeat-ttl)
        while True:
            try:
                until = alive_until - KEY_MARGIN
                if until <= loop.time():   # the key expired: nothing to save by giving up on a handshake
                    until = loop.time() + self.client.timeout
                answer = await self.client.heartbeat(   # a frozen server: the next
                    self.node, timeout=self.interval + heartbeat_window(ttl), until=until)
                ttl = float(answer.get("ttl", 0))
                alive_until = loop.time() + ttl
                if not self.connected.is_set():
                    await self._send(force=True)
                    log.info("node %s: reconnected to the server after %d failed heartbeats", self.node,
                             backoff.failures)
                    self.connected.set()
                    for callback in self.on_reconnect:
                        callback()
                backoff.reset()
                await asyncio.sleep(self.interval)
            except asyncio.CancelledError:
                raise
            except Exception as err:  # noqa: BLE001 whatever failed counts as a failed beat
                if self.connected.is_set():
                    log.warning("node %s: heartbeat failed, engines keep running; retrying: %s", self.node, err)
                self.connected.clear()
                await backoff.sleep()

"""Mutual TLS for the API server, with a log line for every refused handshake.

Python's ssl module verifies the client's chain inside the handshake and offers no
verify callback, and asyncio drops handshake errors silently. So the listener runs
the handshake itself (asyncio's SSLProtocol, wired by hand) and logs why one failed:
unknown CA, no certificate, or the client distrusting us.

At most ``handshakes`` handshakes run at once; the connections accepted beyond them wait, in
the order they came and reading nothing more than what came first (their ClientHello: uvloop
starts reading a connection once it is made, paused or not, so what it read is kept and handed
to the handshake when its turn comes), and each one's handshake timeout runs from its start.
When a server dies, every client it held comes to the others in the same second (a fleet's
agents: a watch and a heartbeat stream each): handshakes all run at once would share the CPU
and all finish late, past the timeout, and each one cut is done again (hack/bench/failover.py).

Validity dates are *not* checked in the handshake (llmgw.pki.tls, check_time=False): the
server checks them per request instead, so an expired certificate is refused with a
log line naming its CN and serial, and the client gets a JSON answer saying so.
"""
from __future__ import annotations

import asyncio
import logging
import ssl
from asyncio.sslproto import SSLProtocol
from collections import deque
from collections.abc import Callable
from typing import Any, cast

from aiohttp import web

log = logging.getLogger("llmgw.server")

# TLS handshakes a listener runs at once (the module's docstring says why): enough to keep the CPU busy
# while each waits a round trip on its client, few enough that they finish one after another. 512, not
# 128: a fleet's clients (their loops seconds late in a herd) kept 128 slots waiting on them while the
# server idled (hack/bench/failover.py: 1,000 agents' watches back p99 14-16 s instead of 27-33 s).
HANDSHAKES = 512

# OpenSSL verify codes that mean "not signed by a CA this server trusts".
_UNKNOWN_CA = {2, 18, 19, 20, 21, 30}


def describe_handshake_error(err: BaseException) -> str:
    if isinstance(err, ssl.SSLCertVerificationError):
        if err.verify_code in _UNKNOWN_CA:
            return f"client certificate not signed by the cluster CA (unknown CA: {err.verify_message})"
        return f"client certificate rejected: {err.verify_message}"
    reason = (getattr(err, "reason", None) or "").upper()
    if "PEER_DID_NOT_RETURN_A_CERTIFICATE" in reason or "CERTIFICATE_REQUIRED" in reason:
        return "no client certificate presented"
    if "ALERT_UNKNOWN_CA" in reason or "ALERT_BAD_CERTIFICATE" in reason:
        return "the client does not trust this server's certificate (check its CA file)"
    if "WRONG_VERSION_NUMBER" in reason or "HTTP_REQUEST" in reason:
        return "not TLS (plain HTTP sent to the HTTPS port?)"
    if isinstance(err, (asyncio.TimeoutError, TimeoutError)):
        return "handshake timed out"
    return str(getattr(err, "reason", None) or err or type(err).__name__)


class _AlertingSSLProtocol(SSLProtocol):
    """asyncio drops the TLS alert of a failed handshake; send it, so the client learns why."""

    def _on_handshake_complete(self, handshake_exc: BaseException | None) -> None:
        if handshake_exc is not None:
            try:
                self._process_outgoing()  # type: ignore[attr-defined]  # asyncio.sslproto's, untyped
            except Exception:  # noqa: BLE001 the peer may be gone already
                pass
        super()._on_handshake_complete(handshake_exc)


class _Handshakes:
    """The handshakes of one listener: at most `limit` at once, the rest queued (see the module docstring)."""

    def __init__(self, limit: int) -> None:
        if limit < 1:
            raise ValueError(f"at least one TLS handshake at a time, not {limit}")
        self.limit, self.running = limit, 0
        self.waiting: deque[_Acceptor] = deque()

    def admit(self, acceptor: "_Acceptor") -> None:
        if self.running < self.limit:
            self.running += 1
            acceptor.start()
        else:
            acceptor.wait()
            self.waiting.append(acceptor)

    def ended(self) -> None:
        """One handshake ended (done, refused, timed out or cut): the next waiting one starts."""
        self.running -= 1
        while self.waiting and self.running < self.limit:
            acceptor = self.waiting.popleft()
            if not acceptor.gone:
                self.running += 1
                acceptor.start()


class _Acceptor(asyncio.Protocol):
    """Runs the TLS handshake for one connection, once its turn comes, then hands it to aiohttp's handler."""

    def __init__(self, handler_factory: Callable[[], asyncio.Protocol], ctx: ssl.SSLContext, timeout: float,
                 handshakes: _Handshakes) -> None:
        self._factory, self._ctx, self._timeout, self._handshakes = handler_factory, ctx, timeout, handshakes
        self._transport: asyncio.Transport | None = None
        self._read: list[bytes] = []   # what came while it waited (uvloop reads a paused connection's first bytes)
        self.gone = False   # the connection ended while it waited for its turn

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.Transport, transport)   # uvloop's TCPTransport: no asyncio subclass
        self._handshakes.admit(self)

    def wait(self) -> None:
        assert self._transport is not None
        # the ClientHello waits in the socket for the handshake's turn; asyncio's loop reads nothing
        # from here, uvloop's starts reading once connection_made returns, paused or not
        self._transport.pause_reading()

    def data_received(self, data: bytes) -> None:
        """Only while it waits, on uvloop: kept for the handshake, and no more read until then."""
        self._read.append(data)
        assert self._transport is not None
        self._transport.pause_reading()

    def connection_lost(self, exc: Exception | None) -> None:
        self.gone = True   # only while waiting: once started, the TLS protocol has the transport

    def start(self) -> None:
        transport = self._transport
        assert transport is not None
        loop = asyncio.get_running_loop()
        peer = transport.get_extra_info("peername")
        waiter = loop.create_future()
        # typeshed has ssl_handshake_timeout an int; asyncio takes seconds, a float (as create_server does)
        tls = _AlertingSSLProtocol(loop, self._factory(), self._ctx, waiter, server_side=True,
                          call_connection_made=True, ssl_handshake_timeout=self._timeout)  # type: ignore[arg-type]
        transport.set_protocol(tls)
        tls.connection_made(transport)
        for data in self._read:   # what came while it waited: the handshake's first bytes
            _feed(tls, data)
        self._read.clear()
        if not transport.is_reading():
            transport.resume_reading()
        waiter.add_done_callback(lambda _: self._handshakes.ended())
        waiter.add_done_callback(lambda fut: _log_failure(fut, peer))


def _feed(protocol: asyncio.BufferedProtocol, data: bytes) -> None:
    """Hand `data` to `protocol` as its transport would have (asyncio's SSLProtocol reads into its buffer)."""
    view = memoryview(data)
    while view:
        buf = memoryview(protocol.get_buffer(len(view)))   # a writable buffer
        n = min(len(buf), len(view))
        buf[:n] = view[:n]
        protocol.buffer_updated(n)
        view = view[n:]


def _log_failure(fut: asyncio.Future[Any], peer: tuple[str, int] | None) -> None:
    err = None if fut.cancelled() else fut.exception()
    if err is None:
        return
    who = f"{peer[0]}:{peer[1]}" if peer else "?"
    if isinstance(err, (ConnectionResetError, BrokenPipeError)):
        log.info("TLS handshake from %s: closed by the client (does it trust this server's certificate?)", who)
        return
    log.warning("refused: TLS handshake from %s: %s", who, describe_handshake_error(err))


class TLSSite(web.TCPSite):
    """TCPSite whose listener logs refused handshakes (see the module docstring)."""

    __slots__ = ("_tls_context", "_handshake_timeout", "_handshakes")

    def __init__(self, runner: web.BaseRunner, host: str | None, port: int | None, *, ssl_context: ssl.SSLContext,
                 handshake_timeout: float = 10.0, handshakes: int = HANDSHAKES, **kw: Any) -> None:
        super().__init__(runner, host, port, **kw)
        self._tls_context = ssl_context
        self._handshake_timeout = handshake_timeout
        self._handshakes = _Handshakes(handshakes)

    @property
    def name(self) -> str:
        return f"https://{self._host or '0.0.0.0'}:{self.port}"

    async def start(self) -> None:
        await web.BaseSite.start(self)
        loop = asyncio.get_running_loop()
        server = self._runner.server
        assert server is not None  # BaseSite.start: the runner is set up
        ctx, timeout, handshakes = self._tls_context, self._handshake_timeout, self._handshakes
        self._server = await loop.create_server(
            lambda: _Acceptor(server, ctx, timeout, handshakes), self._host, self._port,
            backlog=self._backlog, reuse_address=self._reuse_address, reuse_port=self._reuse_port)
        self._bound_port = self._server.sockets[0].getsockname()[1] if self._server.sockets else self._port

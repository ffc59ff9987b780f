"""An aetcd connection with TLS, endpoint failover and a raised gRPC receive limit."""
from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import Awaitable, Callable, TypeVar
from urllib.parse import urlparse

import aetcd
import aetcd.exceptions
import aetcd.watcher
import grpc
from aetcd import rpc

from llmgw.store.errors import StoreFull, StoreMisconfigured, StoreUnavailable

log = logging.getLogger("llmgw.store")

# A long watch replay arrives as one message; gRPC's 4 MiB default is too small.
MAX_MESSAGE_BYTES = 256 * 1024 * 1024

T = TypeVar("T")

# Errors that mean "this endpoint is not answering": try the next one.
UNREACHABLE = (aetcd.exceptions.ConnectionFailedError, aetcd.exceptions.ConnectionTimeoutError)


class _TLSClient(aetcd.Client):  # type: ignore[misc]  # aetcd has no type information: Client is Any
    """aetcd has no TLS option: open a secure channel, then let aetcd set up its stubs."""

    def __init__(self, host: str, port: int, *, credentials: grpc.ChannelCredentials, timeout: float,
                 options: dict[str, int]):
        super().__init__(host, port, timeout=timeout, options=options)
        self._credentials = credentials

    async def connect(self) -> None:
        if self._connected.is_set():
            return
        self.channel = grpc.aio.secure_channel(
            f"{self._host}:{self._port}", self._credentials, options=list(self._options.items()))
        self.kvstub = rpc.KVStub(self.channel)
        self.clusterstub = rpc.ClusterStub(self.channel)
        self.leasestub = rpc.LeaseStub(self.channel)
        self.maintenancestub = rpc.MaintenanceStub(self.channel)
        self._watcher = aetcd.watcher.Watcher(rpc.WatchStub(self.channel), timeout=self._timeout)
        self._connected.set()


def parse_endpoints(endpoints: str | list[str]) -> list[tuple[str, str, int]]:
    """`http://h:2379,https://h2:2379` -> [(scheme, host, port)]."""
    if isinstance(endpoints, str):
        endpoints = [e for e in endpoints.split(",") if e.strip()]
    out = []
    for e in endpoints:
        e = e.strip()
        if "://" not in e:
            e = "http://" + e
        u = urlparse(e)
        if u.scheme not in ("http", "https") or not u.hostname:
            raise ValueError(f"bad etcd endpoint {e!r}: expected http(s)://HOST:PORT")
        out.append((u.scheme, u.hostname, u.port or 2379))
    if not out:
        raise ValueError("no etcd endpoint given")
    return out


class Connection:
    """One live aetcd client at a time, over a list of endpoints; rotates on failure."""

    def __init__(self, endpoints: str | list[str], ca: str | None = None, cert: str | None = None,
                 key: str | None = None, timeout: float = 5.0):
        self.endpoints = parse_endpoints(endpoints)
        self._ca, self._cert, self._key = ca, cert, key
        self._timeout = timeout
        self._index = 0
        self._client: aetcd.Client | None = None
        self._lock = asyncio.Lock()

    @property
    def endpoint(self) -> str:
        scheme, host, port = self.endpoints[self._index]
        return f"{scheme}://{host}:{port}"

    def _new_client(self) -> aetcd.Client:
        scheme, host, port = self.endpoints[self._index]
        options = {
            "grpc.max_receive_message_length": MAX_MESSAGE_BYTES,
            "grpc.max_send_message_length": MAX_MESSAGE_BYTES,
        }
        if scheme == "https" or self._cert:
            creds = grpc.ssl_channel_credentials(
                root_certificates=Path(self._ca).read_bytes() if self._ca else None,
                private_key=Path(self._key).read_bytes() if self._key else None,
                certificate_chain=Path(self._cert).read_bytes() if self._cert else None,
            )
            return _TLSClient(host, port, timeout=self._timeout, options=options, credentials=creds)
        return aetcd.Client(host, port, timeout=self._timeout, options=options)

    async def client(self) -> aetcd.Client:
        if self._client is None:
            async with self._lock:
                if self._client is None:
                    c = self._new_client()
                    await c.connect()
                    self._client = c
        return self._client

    async def _rotate(self, failed: aetcd.Client) -> None:
        async with self._lock:
            if self._client is not failed:
                return  # someone else rotated already
            self._client = None
            self._index = (self._index + 1) % len(self.endpoints)
            log.warning("etcd endpoint unreachable, trying %s", self.endpoint)
        await _close_client(failed)

    async def call(self, fn: Callable[[aetcd.Client], Awaitable[T]]) -> T:
        """Run fn on the live client; on an unreachable endpoint, try each other one once."""
        last: Exception | None = None
        for _ in range(len(self.endpoints)):
            c = await self.client()
            try:
                return await fn(c)
            except asyncio.CancelledError:
                # Closing a channel cancels the calls still in flight on it. If this task
                # was not cancelled itself, another caller gave up on the endpoint and
                # closed it under this call: a failure like any other, not a cancellation.
                task = asyncio.current_task()
                if self._client is c or (task is not None and task.cancelling()):
                    raise
                last = last or ConnectionError("the connection was closed by another caller's failover")
            except UNREACHABLE as err:
                last = err
                await self._rotate(c)
            except grpc.aio.AioRpcError as err:
                if is_nospace(err):
                    raise StoreFull(NOSPACE_MESSAGE) from None
                if not _transient(err):
                    raise
                last = err
                await self._rotate(c)
        error = StoreMisconfigured if _tls_refused(_details(last)) else StoreUnavailable
        raise error(f"no etcd endpoint answered ({', '.join(self._urls())}): {describe_failure(last)}")

    def each(self) -> list["Connection"]:
        """A connection to each endpoint alone (what is done per member: defragmentation)."""
        return [Connection(url, self._ca, self._cert, self._key, self._timeout) for url in self._urls()]

    def _urls(self) -> list[str]:
        return [f"{s}://{h}:{p}" for s, h, p in self.endpoints]

    async def close(self) -> None:
        if self._client is not None:
            c, self._client = self._client, None
            await _close_client(c)


NOSPACE_MESSAGE = ("etcd's space quota is exhausted (its NOSPACE alarm is raised): writes are refused, "
                   "reads still work; the controller-manager's compactor compacts history, defragments the "
                   "members and disarms the alarm (docs/contracts.md, \"etcd full\")")


def is_nospace(err: grpc.aio.AioRpcError) -> bool:
    """etcd's answer to a write while its NOSPACE alarm is raised."""
    return err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED and "space exceeded" in (err.details() or "")


def _transient(err: grpc.aio.AioRpcError) -> bool:
    """etcd did not answer in time or at all: another endpoint, or a later try, may. A deadline
    that ends inside etcd (a member without a quorum) comes back as UNKNOWN with Go's
    "context deadline exceeded", not as DEADLINE_EXCEEDED."""
    code = err.code()
    return code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED) or (
        code == grpc.StatusCode.UNKNOWN and "context deadline exceeded" in (err.details() or ""))


def _details(err: BaseException | None) -> str:
    if not isinstance(err, grpc.aio.AioRpcError):
        return str(err)
    return err.details() or str(err.code())


_CERT_REFUSED = ("BAD_CERTIFICATE", "TSI_DATA_CORRUPTED", "CERTIFICATE_REQUIRED")
_CA_MISMATCH = ("CERTIFICATE_VERIFY_FAILED", "Handshake failed")


def _tls_refused(details: str) -> bool:
    """etcd answered and the TLS handshake failed: a configuration to fix, not an outage to wait out."""
    return any(m in details for m in _CERT_REFUSED + _CA_MISMATCH)


def describe_failure(err: BaseException | None) -> str:
    """One line for why an endpoint did not answer, with the likely fix for a TLS mismatch."""
    details = _details(err)
    if not isinstance(err, grpc.aio.AioRpcError):
        return details
    if any(m in details for m in _CERT_REFUSED):
        return (f"{details}: etcd refused this client's TLS certificate; give --etcd-cert/--etcd-key "
                "from the etcd CA (`llmgw ca issue etcd-client`)")
    if any(m in details for m in _CA_MISMATCH):
        return f"{details}: check --etcd-ca (the etcd CA's ca.crt) and that etcd serves TLS"
    if "Socket closed" in details:
        return (f"{details}: plain http to an etcd that requires TLS? "
                "use https:// endpoints and --etcd-ca/--etcd-cert/--etcd-key")
    return details


async def _close_client(client: aetcd.Client) -> None:
    """Close a client without hanging: aetcd's watcher shutdown can block forever on a
    full request queue once its stream is gone, so bound it and close the channel."""
    try:
        await asyncio.wait_for(client.close(), 3.0)
    except (Exception, asyncio.TimeoutError):  # noqa: BLE001 a dead channel may fail to close; nothing to recover
        if client.channel is not None:
            try:
                await client.channel.close()
            except Exception:  # noqa: BLE001 the channel may be half gone; closing is best effort
                pass

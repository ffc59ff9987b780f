"""The async REST client of `llmgw server` (see docs/contracts.md, "REST").

It takes every API server's URL and uses one at a time, the first in its order at the start
(the URLs ordered by a hash of its certificate with each, so that a fleet's clients spread over
the servers, and the clients of a server that dies over every live one). It moves to the next
in that order when the one it uses does not answer (a connect error, a dropped connection, a
timeout, a watch silent for ``watch_idle_timeout``) or answers 5xx (going away, or its etcd is
unreachable): a request is tried on each server once, in turn, before its error is raised; a
watch raises, and its reflector watches again, after its jittered backoff, on the next server
from the last revision it saw (any server replays it from etcd: no relist). One URL in front of
every server (DNS, a load balancer) is a list of one (docs/contracts.md, "Failover").
"""
from __future__ import annotations

import asyncio
import builtins
import hashlib
import json
import os
import ssl
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple, NoReturn, TypeVar

from llmgw.api import AnyObject, Node, ObjectT
from llmgw.api.client import EventType, ObjectClient, StatusPatch, WatchEvent
from llmgw.api.events import event_key
from llmgw.api.logs import LogQuery
from llmgw.api.manifests import parse_object
from llmgw.api.members import Member
from llmgw.backoff import Backoff
from llmgw.client.config import ClientConfig, server_urls
from llmgw.client.errors import ApiError, Expired, TLSError, Unreachable, error_for
from llmgw.client.oneshot import OneShot
from llmgw.reflector import AfterError, ListerWatcher, Reflector, object_name
from llmgw.version import HEADER
from llmgw.version import version as llmgw_version

# aiohttp is imported where it is used: a client made with oneshot=True (the CLI's verbs) may
# never need it (llmgw.client.oneshot says why that matters).
if TYPE_CHECKING:
    import aiohttp

BASE = "/apis/llmgw.io/v1"

Kind = type[AnyObject]
T = TypeVar("T")


def _ssl_context(ca: str | None, cert: str | None, key: str | None) -> ssl.SSLContext:
    if ca and not os.path.exists(ca):
        raise TLSError("server", f"cannot read CA file {ca}: no such file")
    try:
        ctx = ssl.create_default_context(cafile=ca)
    except (OSError, ssl.SSLError) as err:
        raise TLSError("server", f"cannot load CA file {ca}: {getattr(err, 'strerror', None) or err}") from None
    if cert:
        for path in (cert, key):
            if path and not os.path.exists(path):
                raise TLSError("client", f"cannot read {path}: no such file")
        try:
            ctx.load_cert_chain(cert, key)
        except (OSError, ssl.SSLError) as err:
            raise TLSError("client", f"cannot load {cert} / {key}: {err}") from None
    return ctx


# OpenSSL alert reasons a client sees when the *server* refused its certificate.
_CLIENT_SIDE = {
    "UNKNOWN_CA": "signed by a CA the server does not trust",
    "CERTIFICATE_EXPIRED": "expired",
    "CERTIFICATE_REVOKED": "revoked",
    "CERTIFICATE_REQUIRED": "the server requires a client certificate and none was sent (set cert and key)",
    "BAD_CERTIFICATE": "rejected by the server",
    "UNSUPPORTED_CERTIFICATE": "rejected by the server (unsupported certificate)",
    "HANDSHAKE_FAILURE": "handshake refused by the server",
}


# TLS errors that say the connection ended mid-handshake or mid-record (a server killed then), not
# that either side refused the other: another server may answer.
_CUT = (ssl.SSLWantReadError, ssl.SSLWantWriteError, ssl.SSLZeroReturnError, ssl.SSLSyscallError, ssl.SSLEOFError)


def _find_ssl_error(err: BaseException | None) -> ssl.SSLError | None:
    seen = 0
    while err is not None and seen < 6:
        if isinstance(err, ssl.SSLError):
            return err
        err = getattr(err, "os_error", None) or err.__cause__ or err.__context__
        seen += 1
    return None


def _translate(err: BaseException, url: str) -> ApiError:
    import aiohttp

    if isinstance(err, aiohttp.ClientConnectorCertificateError):
        cert_err = err.certificate_error
        why = getattr(cert_err, "verify_message", None) or str(cert_err)
        if "Hostname mismatch" in str(cert_err) or "IP address mismatch" in str(cert_err):
            why = f"{why} (issue one with `llmgw ca issue server --san HOST`)"
        return TLSError("server", f"not trusted: {why}", url)
    ssl_err = _find_ssl_error(err)
    if isinstance(ssl_err, _CUT):
        return Unreachable(url, f"the connection was cut during TLS ({ssl_err})")
    if ssl_err is not None:
        if isinstance(ssl_err, ssl.SSLCertVerificationError):
            return TLSError("server", f"not trusted: {ssl_err.verify_message}", url)
        reason = (getattr(ssl_err, "reason", None) or "").upper()
        for key, why in _CLIENT_SIDE.items():
            if key in reason:
                return TLSError("client", why, url)
        return TLSError("client" if "ALERT" in reason else "server", str(ssl_err.reason or ssl_err), url)
    if isinstance(err, (asyncio.TimeoutError, TimeoutError)):
        return Unreachable(url, "timed out")
    if isinstance(err, aiohttp.ClientConnectorError):
        # "Connection refused" (its errno's words), as http.client says it, not asyncio's "Connect call failed"
        os_err = err.os_error
        return Unreachable(url, (os.strerror(os_err.errno) if os_err.errno else os_err.strerror) or str(os_err))
    if isinstance(err, aiohttp.ServerDisconnectedError):
        return Unreachable(url, "the server closed the connection")
    if isinstance(err, OSError) and err.strerror:
        return Unreachable(url, err.strerror)   # http.client's: ConnectionRefusedError and the like
    return Unreachable(url, str(err) or type(err).__name__)


async def _error_from_response(resp: aiohttp.ClientResponse, url: str) -> ApiError:
    return _error_from_text(resp.status, resp.reason or "", await resp.text(), url)


async def _oneshot_request(oneshot: OneShot, url: str, method: str, path: str, params: dict[str, str],
                           body: Any, timeout: float | None) -> Any:
    """Client.request through http.client: the same answers and errors."""
    try:
        answer = await oneshot.request(method, path, params, body, timeout)
    except (OSError, asyncio.TimeoutError) as err:
        raise _translate(err, url) from None
    if answer.status >= 400:
        raise _error_from_text(answer.status, answer.reason, answer.text, url)
    try:
        return json.loads(answer.text)
    except ValueError:
        raise ApiError(answer.status, "BadResponse", f"the server's answer is not JSON: {answer.text[:200]!r}",
                       url) from None


def _error_from_text(status: int, reason: str, text: str, url: str) -> ApiError:
    try:
        body = json.loads(text)
        return error_for(status, body.get("reason", reason), body.get("message", text), url, body.get("details"))
    except (ValueError, AttributeError):
        return error_for(status, reason, f"{status} {reason}: {text.strip()[:200]}", url)



def _failover_order(servers: list[str], cert: str | None) -> list[str]:
    """The servers in the order a client tries them: by rendezvous hashing of its certificate (its
    identity) with each URL, highest first (no certificate: as given). So a fleet's clients spread
    over every server from the start, a client keeps its server from one run to the next, and the
    clients of a server that dies go to each of the others, not all to one, where a fleet's
    reconnections (a TLS handshake each) would queue (hack/bench/failover.py)."""
    if len(servers) < 2 or not cert:
        return servers
    with open(cert, "rb") as f:
        identity = hashlib.sha256(f.read()).digest()
    return sorted(servers, key=lambda url: hashlib.sha256(identity + url.encode()).digest(), reverse=True)


def _moves_on(err: ApiError) -> bool:
    """Whether another server may answer where this one failed: it gave no answer, or a 5xx."""
    return isinstance(err, Unreachable) or err.code >= 500


class Client:
    """`async with Client(url, ca=, cert=, key=) as c:`; see llmgw.client for the methods.
    ``url``: a server's URL, or several (a sequence, or comma-separated), every one of the cluster.

    An ``llmgw.api.ObjectClient``: kinds by class (``await c.get(Replica, "r1")`` is a
    Replica) or by name (``"replicas"``, ``"rep"``)."""

    def __init__(self, server: str | Sequence[str], ca: str | None = None, cert: str | None = None,
                 key: str | None = None, *, timeout: float = 30.0, watch_idle_timeout: float = 90.0,
                 connections: int = 100, oneshot: bool = False, version: str | None = None):
        """oneshot: requests (not watches, not logs) through http.client (llmgw.client.oneshot), for
        a short-lived command that may be done before aiohttp would have been imported.
        version: the llmgw version this client reports in its X-Llmgw-Version header (default: the
        installed llmgw's), which the server holds an agent's, a gateway's or a controller-manager's
        to the version skew policy by (llmgw/version.py); a oneshot client, a user's, sends none."""
        urls = server_urls(server)
        if not urls:
            raise ValueError("a client needs a server's URL")
        https = any(url.startswith("https://") for url in urls)
        self._ssl = _ssl_context(ca, cert, key) if https else None
        self.servers = _failover_order(urls, cert)   # this client's order
        self._at = 0   # the server in use: self.servers[self._at]
        self._ca = ca
        self._timeout_s, self._watch_idle_s = timeout, watch_idle_timeout
        self._connections = connections
        self._version = version
        self._session: aiohttp.ClientSession | None = None
        self._retiring: set[asyncio.Future[None]] = set()   # sessions of a certificate replaced (use_certificate)
        self._certificates = 0   # how many times it was replaced: a watch opened before ends at its next line
        self._beats: dict[str, aiohttp.ClientWebSocketResponse] = {}   # by heartbeat URL: its open stream
        self._closing: set[asyncio.Future[bool]] = set()                 # streams given up, closing
        self._oneshots = {url: OneShot(url, self._ssl, timeout) for url in self.servers} if oneshot else None

    @property
    def timeout(self) -> float:
        """How long each server may take to answer a request given no timeout of its own (s)."""
        return self._timeout_s

    @property
    def server(self) -> str:
        """The URL of the server in use."""
        return self.servers[self._at]

    def _away_from(self, server: str) -> None:
        """Use the next server, unless another request already moved on from ``server``."""
        if self.server == server:
            self._at = (self._at + 1) % len(self.servers)

    @property
    def _watch_timeout(self) -> aiohttp.ClientTimeout:
        """A watch lasts forever; bookmarks arrive every few seconds, so silence means a dead server."""
        import aiohttp

        return aiohttp.ClientTimeout(total=None, sock_connect=self._timeout_s, sock_read=self._watch_idle_s)

    @property
    def _stream_timeout(self) -> aiohttp.ClientTimeout:
        """A followed log may be silent for as long as its engine is."""
        import aiohttp

        return aiohttp.ClientTimeout(total=None, sock_connect=self._timeout_s)

    @classmethod
    def from_config(cls, cfg: ClientConfig | None = None, **kw: Any) -> "Client":
        cfg = cfg or ClientConfig.load()
        return cls(cfg.server, ca=cfg.ca, cert=cfg.cert, key=cfg.key, **kw)

    async def __aenter__(self) -> "Client":
        if self._oneshots is None:
            self._open()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def _open(self) -> aiohttp.ClientSession:
        import aiohttp

        if self._session is None or self._session.closed:
            connector = aiohttp.TCPConnector(ssl=self._ssl if self._ssl else False, limit=self._connections)
            self._session = aiohttp.ClientSession(connector=connector,
                                                  timeout=aiohttp.ClientTimeout(total=self._timeout_s),
                                                  headers={HEADER: self._version or llmgw_version()})
        return self._session

    async def close(self) -> None:
        for retiring in self._retiring:
            retiring.cancel()
        await asyncio.gather(*self._retiring, return_exceptions=True)
        for oneshot in (self._oneshots or {}).values():
            oneshot.close()
        for url in list(self._beats):
            self._drop_beats(url)
        await asyncio.gather(*self._closing, return_exceptions=True)
        if self._session is not None:
            await self._session.close()
            self._session = None

    # ---------------------------------------------------------- plumbing
    async def request(self, method: str, path: str, *, params: dict[str, Any] | None = None,
                      body: Any = None, timeout: float | None = None) -> Any:
        """One request, tried on each server in turn while they fail (see the module's docstring);
        ``timeout``: how long each server may take, instead of the client's."""
        query = {k: str(v) for k, v in (params or {}).items() if v is not None}
        return await self._on_servers(lambda server: self._request(server, method, path, query, body, timeout))

    async def _on_servers(self, call: Callable[[str], Awaitable[T]]) -> T:
        """``call(server)`` on the server in use, then on each next one at once while they fail
        (no wait between servers: a backoff is the caller's, once every server failed)."""
        tries = len(self.servers)
        while True:
            server = self.server
            try:
                return await call(server)
            except ApiError as err:
                tries -= 1
                if not _moves_on(err):
                    raise
                self._away_from(server)
                if not tries:
                    raise

    async def _request(self, server: str, method: str, path: str, params: dict[str, str], body: Any,
                       timeout: float | None) -> Any:
        url = server + path
        if self._oneshots is not None:
            return await _oneshot_request(self._oneshots[server], url, method, path, params, body, timeout)
        import aiohttp

        session = self._open()
        # no timeout given: the session's, the client's (aiohttp takes timeout=None for none at all)
        limit = aiohttp.ClientTimeout(total=timeout) if timeout is not None else session.timeout
        try:
            async with session.request(method, url, params=params, json=body, timeout=limit) as resp:
                if resp.status >= 400:
                    raise await _error_from_response(resp, url)
                return await resp.json()
        except ApiError:
            raise
        except (aiohttp.ClientError, OSError, asyncio.TimeoutError) as err:
            raise _translate(err, url) from None


    @staticmethod
    def _path(kind: Kind, name: str | None = None, sub: str | None = None) -> str:
        path = f"{BASE}/{kind.kind_plural}"
        if name is not None:
            path += f"/{name}"
        if sub:
            path += f"/{sub}"
        return path

    @staticmethod
    def _dump(obj: AnyObject) -> dict[str, Any]:
        return obj.model_dump(mode="json")

    # -------------------------------------------------------------- verbs

    async def get(self, kind: type[ObjectT], name: str, node: str | None = None) -> ObjectT:
        return self._of(kind, await self.request("GET", self._path(kind, name), params={"node": node}))


    async def list(self, kind: type[ObjectT], selector: str | None = None,
                   node: str | None = None) -> tuple[builtins.list[ObjectT], int]:
        data = await self.request("GET", self._path(kind), params={"labelSelector": selector, "node": node})
        return [self._of(kind, i) for i in data["items"]], int(data["metadata"]["resourceVersion"])

    async def nodes_with_weights(self, source: str, digest: str | None = None) -> builtins.list[Node]:
        """The Nodes that hold or pull `source`, or hold the content `digest`: the server answers
        from its index (llmgw/server/weightsindex.py), not from a list of the fleet."""
        data = await self.request("GET", self._path(Node), params={"weights": source, "digest": digest})
        return [self._of(Node, i) for i in data["items"]]

    async def create(self, obj: ObjectT) -> ObjectT:
        return self._same(obj, await self.request("POST", self._path(type(obj)), body=self._dump(obj)))

    async def update(self, obj: ObjectT) -> ObjectT:
        path = self._path(type(obj), obj.name)
        return self._same(obj, await self.request("PUT", path, body=self._dump(obj)))

    async def update_status(self, obj: ObjectT) -> ObjectT:
        path = self._path(type(obj), obj.name, "status")
        return self._same(obj, await self.request("PUT", path, body=self._dump(obj)))


    async def patch_status(self, kind: type[ObjectT], name: str, patch: StatusPatch,
                           node: str | None = None) -> ObjectT:
        path = self._path(kind, name, "status")
        return self._of(kind, await self.request("PATCH", path, params={"node": node}, body=dict(patch)))


    async def delete(self, kind: type[ObjectT], name: str, node: str | None = None) -> ObjectT:
        return self._of(kind, await self.request("DELETE", self._path(kind, name), params={"node": node}))

    async def apply(self, obj: ObjectT) -> tuple[str, ObjectT]:
        data = await self.request("POST", self._path(type(obj), obj.name, "apply"), body=self._dump(obj))
        return data["result"], self._same(obj, data["object"])

    @classmethod
    def _same(cls, obj: ObjectT, doc: Any) -> ObjectT:
        """The server's answer about ``obj``: an object of ``obj``'s kind."""
        return cls._of(type(obj), doc)

    @staticmethod
    def _of(kind: type[ObjectT], doc: Any) -> ObjectT:
        """The server's answer about an object of ``kind``."""
        answer = parse_object(doc)
        if not isinstance(answer, kind):
            raise ApiError(0, "BadResponse", f"the server answered about a {kind.__name__} with a {answer.kind}")
        return answer

    async def heartbeat(self, node: str, ttl: int | None = None, timeout: float | None = None,
                        until: float | None = None) -> dict[str, Any]:
        """Keep the node's heartbeat key alive; ``timeout``: how long each server may take (the
        agent's heartbeat interval: a frozen server must not hold a beat past the key's life).
        ``until`` (the event loop's clock): a beat that must open a new stream (the first, or one
        moving to another server) may take until then where that is later than ``timeout``, so a
        handshake slowed by a fleet reconnecting at once is finished, not abandoned and redone on
        the next server (the agent passes when its key expires, less a margin).
        A beat is a message on a WebSocket kept open to the server in use (one connection, no
        request per beat); a oneshot client POSTs each beat. Servers are tried as by ``request``."""
        body = {"ttl": ttl} if ttl else {}
        if self._oneshots is not None:
            result: dict[str, Any] = await self.request("POST", f"{BASE}/heartbeat/{node}", body=body,
                                                        timeout=timeout)
            return result
        limit = timeout or self._timeout_s
        return await self._on_servers(lambda server: self._beat(server, node, body, limit, until))

    async def _beat(self, server: str, node: str, body: dict[str, Any], timeout: float,
                    until: float | None) -> dict[str, Any]:
        import aiohttp

        url = f"{server}{BASE}/heartbeat/{node}"
        loop = asyncio.get_running_loop()

        def deadline(new_stream: bool) -> float:
            return max(loop.time() + timeout, until or 0.0) if new_stream else loop.time() + timeout
        try:
            kept = url in self._beats and not self._beats[url].closed
            async with asyncio.timeout_at(deadline(not kept)):
                msg = await self._send_beat(url, body)
            if msg.type != aiohttp.WSMsgType.TEXT and kept:
                # the stream kept open had ended meanwhile (the server closed it, or went away):
                # once more on a new one, as an HTTP client retries on a new connection
                self._drop_beats(url)
                async with asyncio.timeout_at(deadline(True)):
                    msg = await self._send_beat(url, body)
        except aiohttp.WSServerHandshakeError:
            # refused before the stream began (authentication, authorization, version skew): the
            # same beat POSTed has the refusal's Status, which the handshake's answer does not carry
            result: dict[str, Any] = await self._request(server, "POST", f"{BASE}/heartbeat/{node}", {}, body, timeout)
            return result
        except (aiohttp.ClientError, OSError, asyncio.TimeoutError) as err:
            self._drop_beats(url)
            raise _translate(err, url) from None
        if msg.type != aiohttp.WSMsgType.TEXT:   # closed: the server stops (1001), or the connection broke
            self._drop_beats(url)
            raise Unreachable(url, f"the server closed the heartbeat stream ({msg.extra or msg.type.name})")
        answer: dict[str, Any] = json.loads(msg.data)
        if "code" in answer:   # a refusal, as a Status
            if answer["code"] == 401:   # the server closes the stream after it
                self._drop_beats(url)
            raise error_for(int(answer["code"]), answer.get("reason", ""), answer.get("message", ""), url)
        return answer

    async def _send_beat(self, url: str, body: dict[str, Any]) -> aiohttp.WSMessage:
        """A beat on the stream kept open to ``url`` (opened first if there is none); the answer."""
        import aiohttp

        ws = self._beats.get(url)
        if ws is None or ws.closed:
            ws = self._beats[url] = await self._open().ws_connect(
                url, autoclose=False, max_msg_size=1 << 16, timeout=aiohttp.ClientWSTimeout(ws_close=2.0))
        await ws.send_str(json.dumps(body))
        return await ws.receive()

    def _drop_beats(self, url: str) -> None:
        """Forget the stream; its close goes on meanwhile (a frozen server would hold it 2 s)."""
        ws = self._beats.pop(url, None)
        if ws is not None and not ws.closed:
            closing = asyncio.ensure_future(ws.close())
            self._closing.add(closing)
            closing.add_done_callback(self._closing.discard)

    async def report_demand(self, gateway: str, models: dict[str, dict[str, int]],
                            ttl: int | None = None, keys: dict[str, Any] | None = None,
                            metrics: str | None = None) -> dict[str, Any]:
        """A gateway's demand, ``{model: {"inFlight": n, "waiting": m}}``, kept for ``ttl`` s unless reported
        again; with ``keys``, its API keys' usage (llmgw/api/usage.py's KeyUsage by key name), kept as long;
        with ``metrics``, the HOST:PORT of its GET /metrics."""
        body: dict[str, Any] = {"models": models, **({"ttl": ttl} if ttl else {}),
                                **({"keys": keys} if keys is not None else {}),
                                **({"metrics": metrics} if metrics is not None else {})}
        result: dict[str, Any] = await self.request("POST", f"{BASE}/demand/{gateway}", body=body)
        return result

    async def withdraw_demand(self, gateway: str) -> None:
        """Delete a gateway's demand report and its keys' usage now (a gateway that stops), rather than
        leave them to expire with their lease. A server of a version without the route answers 404 or
        405: taken as done (the report then expires with its lease)."""
        try:
            await self.request("DELETE", f"{BASE}/demand/{gateway}")
        except ApiError as err:
            if err.code not in (404, 405):
                raise

    async def apikey_usage(self, name: str | None = None) -> dict[str, Any]:
        """API keys' usage summed over the live gateways: ``{"gateways": n, "keys": {name: usage}}``,
        or for one key ``{"gateways": n, "name": name, "usage": usage}`` (llmgw/api/usage.py's KeyUsage)."""
        path = f"{BASE}/usage/apikeys" + (f"/{name}" if name is not None else "")
        result: dict[str, Any] = await self.request("GET", path)
        return result

    async def events(self, kind: Kind, name: str) -> builtins.list[dict[str, Any]]:
        """One object's events, oldest first."""
        return (await self.list_events(kind, name))[0]

    async def list_events(self, kind: Kind | None = None,
                          name: str | None = None) -> tuple[builtins.list[dict[str, Any]], int]:
        """Every object's events (a kind's, one object's), oldest first, each with its "kind",
        "name", "id", "type", "reason", "message" and "time"; and the revision to watch after."""
        data = await self.request("GET", f"{BASE}/events", params=_about(kind, name))
        return data["items"], int(data["metadata"]["resourceVersion"])

    async def watch_events(self, from_revision: int, kind: Kind | None = None,
                           name: str | None = None) -> AsyncIterator[EventChange]:
        """Events recorded (ADDED) and expired (DELETED) at ``from_revision`` and after; errors as ``watch``'s."""
        params = {"watch": "1", "resourceVersion": str(from_revision - 1), **_about(kind, name)}
        async for type_, doc, revision in self._watch_lines(f"{BASE}/events", params):
            yield EventChange(type_, doc, revision)

    def events_lister_watcher(self, kind: Kind | None = None, name: str | None = None) -> "ServerEvents":
        """The events (of ``kind``, of its object ``name``) as a reflector's lister-watcher."""
        return ServerEvents(self, kind, name)

    async def record_event(self, kind: Kind, name: str, type: str, reason: str, message: str) -> dict[str, Any]:
        body = {"kind": kind.kind_plural, "name": name, "type": type, "reason": reason, "message": message}
        result: dict[str, Any] = await self.request("POST", f"{BASE}/events", body=body)
        return result

    async def revoke(self, serial: str, role: str | None = None, name: str | None = None) -> dict[str, Any]:
        """Revoke a certificate by its serial (admins only); `role` and `name` are recorded beside it."""
        body = {"serial": serial, **({"role": role} if role else {}), **({"name": name} if name else {})}
        result: dict[str, Any] = await self.request("POST", f"{BASE}/revocations", body=body)
        return result

    async def renew_certificate(self, csr_pem: str) -> str:
        """A new certificate for this client's identity, for the key of `csr_pem` (a node's or a
        component's; the server's signing CA): the PEM chain to present."""
        result = await self.request("POST", f"{BASE}/renewals", body={"csr": csr_pem})
        return str(result["certificate"])

    async def renewals(self) -> builtins.list[dict[str, Any]]:
        """Every certificate renewed through the API (admins): serial, from, role, name, notAfter."""
        result = await self.request("GET", f"{BASE}/renewals")
        return list(result["items"])

    async def try_certificate(self, cert: str, key: str) -> None:
        """Raise unless the servers accept `cert` (the client's servers and CA, a new session)."""
        async with Client(self.servers, ca=self._ca, cert=cert, key=key, timeout=self._timeout_s,
                          version=self._version) as other:
            await other.whoami()

    def use_certificate(self, cert: str, key: str) -> None:
        """Present `cert` from now on: every request from now on goes through a new session, whose
        connections present it. A watch opened before ends at its next line (a bookmark at the
        latest), which the reflector watching through it takes as any ended watch: it watches
        again from its last revision, on the new session. The old session is closed once its
        requests in flight had the client's timeout to end."""
        if self._ssl is None:
            raise ValueError("this client speaks plain HTTP: it presents no certificate")
        self._ssl.load_cert_chain(cert, key)
        self._certificates += 1
        old, self._session = self._session, None
        if old is not None:
            retiring = asyncio.ensure_future(self._retire(old))
            self._retiring.add(retiring)
            retiring.add_done_callback(self._retiring.discard)

    async def _retire(self, session: aiohttp.ClientSession) -> None:
        try:
            await asyncio.sleep(self._timeout_s)
        finally:
            await session.close()

    async def server_versions(self) -> dict[str, str]:
        """Each of this client's servers' llmgw version (its /healthz answer), by URL; for one that
        does not answer, why (the error's line)."""
        versions = {}
        for server in self.servers:
            try:
                versions[server] = str((await self._request(server, "GET", "/healthz", {}, None, None))["version"])
            except ApiError as err:
                versions[server] = f"unknown: {err}"
        return versions

    async def cluster_versions(self) -> dict[str, Any]:
        """The server's llmgw version, each live gateway's and the leading controller-manager's, and
        each live server's and controller-manager's from their announcements:
        ``{"server": v, "gateways": {name: v}, "controllerManager": {"holder": id, "version": v} | None,
        "servers": {name: v}, "controllerManagers": {identity: v}}`` (a version None: that component
        sent none)."""
        result: dict[str, Any] = await self.request("GET", f"{BASE}/versions")
        return result

    async def members(self) -> dict[str, builtins.list[Member]]:
        """The live servers, controller-managers and gateways with their versions and addresses:
        ``{"servers": [...], "controllerManagers": [...], "gateways": [...]}`` (llmgw/api/members.py)."""
        got = await self.request("GET", f"{BASE}/members")
        return {group: [Member.model_validate(m) for m in got.get(group, [])]
                for group in ("servers", "controllerManagers", "gateways")}

    async def list_and_watch_revocations(self, retry_max: float = 5.0,
                                         synced: bool = False) -> AsyncIterator[tuple[str, str | None]]:
        """``list_and_watch`` of the revoked serials (lower case): ADDED when revoked (any certificate
        may read them, as a CA's revocation list: the agents' listeners refuse what the server does);
        `synced`: ("SYNCED", None) once they are listed."""
        async for type_, doc in _reflect(ServerRevocations(self), _serial, synced, retry_max, "watch of revocations"):
            yield type_, None if doc is None else _serial(doc)

    async def whoami(self) -> dict[str, Any]:
        """Who this client's certificate is, as the server sees it: name, role, groups, its bindings."""
        result: dict[str, Any] = await self.request("GET", f"{BASE}/whoami")
        return result

    async def can_i(self, verb: str, kind: str, name: str | None = None, user: str | None = None,
                    groups: builtins.list[str] | None = None, labels: dict[str, str] | None = None) -> dict[str, Any]:
        """Whether the server would let this certificate (or, for an admin, `user` in `groups`) do
        `verb` on `kind` (its object `name`, or one with `labels`): {allowed, reason}."""
        body = {"verb": verb, "kind": kind, "name": name, "user": user, "groups": groups or [], "labels": labels}
        result: dict[str, Any] = await self.request("POST", f"{BASE}/accessreviews", body=body)
        return result

    async def log(self, kind: Kind, name: str, query: LogQuery, *, rank: int | None = None,
                  node: str | None = None) -> AsyncIterator[bytes]:
        """An engine's log as the server relays it from the node's agent (``llmgw logs``): a shard's,
        or a replica's shard of ``rank``. Raises before the first chunk when refused; a followed
        log lasts as long as the engine runs, so no overall timeout applies."""
        import aiohttp

        server = self.server
        url = server + self._path(kind, name, "log")
        extra = {"rank": rank, "node": node}
        params = {**query.params(), **{k: str(v) for k, v in extra.items() if v is not None}}
        try:
            async with self._open().get(url, params=params, timeout=self._stream_timeout) as resp:
                if resp.status >= 400:
                    raise await _error_from_response(resp, url)
                async for chunk in resp.content.iter_any():
                    yield chunk
        except ApiError as err:
            self._failed(server, err)
        except (aiohttp.ClientError, OSError, asyncio.TimeoutError) as err:
            self._failed(server, _translate(err, url))

    # --------------------------------------------------------------- watch

    async def watch(self, kind: type[ObjectT], from_revision: int | None = None, node: str | None = None, *,
                    resource_version: int | None = None,
                    selector: str | None = None) -> AsyncIterator[WatchEvent[ObjectT]]:
        """Changes at ``from_revision`` and after (as ``Store.watch``), or, in the REST API's terms,
        after ``resource_version``; with neither, every current object as ADDED first.

        Raises Expired when that revision was compacted: relist and watch from the list's
        revision. Returns when the server ends the stream; raises Unreachable when it drops:
        re-watch from the last event's revision either way.
        """
        if from_revision is not None:
            if resource_version is not None:
                raise TypeError("watch from_revision or after resource_version, not both")
            resource_version = from_revision - 1
        params = {"watch": "1", "resourceVersion": resource_version, "node": node, "labelSelector": selector}
        query = {k: str(v) for k, v in params.items() if v is not None}
        async for type_, doc, revision in self._watch_lines(self._path(kind), query):
            yield WatchEvent(type_, self._of(kind, doc), revision)

    async def _watch_lines(self, path: str, query: dict[str, str]) -> AsyncIterator[tuple[EventType, Any, int]]:
        """A watch stream's (type, object, revision), BOOKMARKs skipped; an ERROR line raised."""
        import aiohttp

        server = self.server
        url = server + path
        certificate = self._certificates
        opened = False
        try:
            async with self._open().get(url, params=query, timeout=self._watch_timeout) as resp:
                if resp.status >= 400:
                    raise await _error_from_response(resp, url)
                opened = True
                async for line in resp.content:
                    if certificate != self._certificates:
                        return   # opened with a certificate since replaced: the caller watches again, with the new
                    if not line.strip():
                        continue
                    ev = json.loads(line)
                    if ev["type"] == "BOOKMARK":
                        continue
                    if ev["type"] == "ERROR":
                        o = ev.get("object", {})
                        raise error_for(int(o.get("code", 500)), o.get("reason", ""), o.get("message", ""), url)
                    yield ev["type"], ev["object"], int(ev.get("revision", 0))
        except ApiError as err:
            self._failed(server, err, opened)
        except (aiohttp.ClientError, OSError, asyncio.TimeoutError) as err:
            self._failed(server, _translate(err, url), opened)

    def _failed(self, server: str, err: ApiError, streamed: bool = False) -> NoReturn:
        """A stream from ``server`` failed with ``err`` (``streamed``: after it was open): the next
        one goes elsewhere if another may answer."""
        err.streamed = streamed
        if _moves_on(err):
            self._away_from(server)
        raise err from None

    def lister_watcher(self, kind: Kind, node: str | None = None,
                       selector: str | None = None) -> "ServerObjects":
        """The objects of ``kind`` (on ``node``, matching ``selector``) as a reflector's lister-watcher."""
        return ServerObjects(self, kind, node, selector)

    async def list_and_watch(self, kind: Kind, node: str | None = None, selector: str | None = None,
                             synced: bool = False,
                             retry_max: float = 5.0) -> AsyncIterator[tuple[str, AnyObject | None]]:
        """Informer stream: ("ADDED"|"MODIFIED"|"DELETED", obj) forever, from a reflector
        (llmgw.reflector) over ``lister_watcher``.

        Lists, emits what changed since the previous list (a synthetic DELETED for each object
        that vanished meanwhile), then watches from the list's revision; relists on Expired,
        re-watches after a drop (with backoff while the server is unreachable). With
        synced=True it also yields ("SYNCED", None) after each list has been emitted.
        Forbidden, NotFound and other request errors are raised.
        """
        async for item in _reflect(self.lister_watcher(kind, node, selector), object_name, synced, retry_max,
                                   f"watch of {kind.kind_plural}"):
            yield item

    async def list_and_watch_events(self, kind: Kind | None = None, name: str | None = None, synced: bool = False,
                                    retry_max: float = 5.0) -> AsyncIterator[tuple[str, dict[str, Any] | None]]:
        """``list_and_watch`` of the events (of ``kind``, of its object ``name``): ADDED when
        recorded, DELETED when expired, relisted and re-watched as objects are."""
        async for item in _reflect(self.events_lister_watcher(kind, name), event_key, synced, retry_max,
                                   "watch of events"):
            yield item


class EventChange(NamedTuple):
    """A change to the events a watch of them follows: one recorded (ADDED) or expired (DELETED);
    or to the revoked serials ({"serial": ...}, ADDED when revoked)."""

    type: EventType
    object: dict[str, Any]
    revision: int


async def _reflect(lw: ListerWatcher[T], key: Callable[[T], str], synced: bool, retry_max: float,
                   name: str) -> AsyncIterator[tuple[str, T | None]]:
    """A reflector's calls as a stream (``list_and_watch``); what ended it is raised."""
    # The reflector calls back; this generator hands its calls on, in order, then what ended it.
    queue: asyncio.Queue[tuple[str, T | None] | None] = asyncio.Queue()
    reflector = Reflector(lw, lambda type_, item, _rev: queue.put_nowait((type_, item)), key=key,
                          on_synced=(lambda: queue.put_nowait(("SYNCED", None))) if synced else None,
                          backoff=Backoff(0.1, retry_max), name=name)
    task = asyncio.ensure_future(reflector.run())
    task.add_done_callback(lambda _: queue.put_nowait(None))
    try:
        while (item := await queue.get()) is not None:
            yield item
        task.result()   # raises what ended it
    finally:
        task.cancel()


def _serial(doc: dict[str, Any]) -> str:
    return str(doc["serial"])


def _about(kind: Kind | None, name: str | None) -> dict[str, str]:
    """The query of GET /events that says whose events."""
    return {k: v for k, v in (("kind", kind.kind_plural if kind else None), ("name", name)) if v is not None}


def _after_watch_error(err: Exception) -> AfterError:
    if isinstance(err, Expired):
        return "relist"
    if isinstance(err, Unreachable) or (isinstance(err, ApiError) and err.code >= 500):
        # the server or its etcd is away: it comes back. A watch the server had answered was
        # established since the last failure: its backoff starts over (a quiet watch's waits
        # would otherwise grow with each failover, as no event resets them)
        return "resume" if err.streamed else "retry"
    return "raise"       # refused (401, 403), not found, a bad query: the caller decides


class ServerEvents:
    """Events on the server, as a reflector's lister-watcher (llmgw.reflector): `llmgw events -w`."""

    def __init__(self, client: Client, kind: Kind | None, name: str | None) -> None:
        self.client, self.kind, self.name = client, kind, name

    async def list(self) -> tuple[Sequence[dict[str, Any]], int]:
        return await self.client.list_events(self.kind, self.name)

    def watch(self, from_revision: int) -> AsyncIterator[EventChange]:
        return self.client.watch_events(from_revision, self.kind, self.name)

    after_error = staticmethod(_after_watch_error)


class ServerRevocations:
    """The revoked serials on the server, as a reflector's lister-watcher (llmgw.reflector)."""

    def __init__(self, client: Client) -> None:
        self.client = client

    async def list(self) -> tuple[Sequence[dict[str, Any]], int]:
        data = await self.client.request("GET", f"{BASE}/revocations")
        return data["items"], int(data["metadata"]["resourceVersion"])

    async def watch(self, from_revision: int) -> AsyncIterator[EventChange]:
        params = {"watch": "1", "resourceVersion": str(from_revision - 1)}
        async for type_, doc, revision in self.client._watch_lines(f"{BASE}/revocations", params):
            yield EventChange(type_, doc, revision)

    after_error = staticmethod(_after_watch_error)


class ServerObjects:
    """A kind's objects on the server, as a reflector's lister-watcher (llmgw.reflector)."""

    def __init__(self, client: Client, kind: Kind, node: str | None, selector: str | None) -> None:
        self.client, self.kind, self.node, self.selector = client, kind, node, selector

    async def list(self) -> tuple[Sequence[AnyObject], int]:
        return await self.client.list(self.kind, selector=self.selector, node=self.node)

    def watch(self, from_revision: int) -> AsyncIterator[WatchEvent[AnyObject]]:
        return self.client.watch(self.kind, from_revision, self.node, selector=self.selector)

    after_error = staticmethod(_after_watch_error)


if TYPE_CHECKING:
    def _is_an_object_client(client: Client) -> None:
        _: ObjectClient = client   # mypy checks that Client implements the protocol

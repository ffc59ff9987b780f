"""Clients that fail over: three real `llmgw server`s over one real etcd, one killed (or frozen);
the client's requests and watches go on on the others, a watch from its last revision (no relist)."""
from __future__ import annotations

import asyncio
import os
import signal
import ssl
import time

import pytest

from llmgw.agent.config import load_config
from llmgw.api import Model, Node, parse_object
from llmgw.client import Client, ClientConfig, ConfigError, Unavailable, Unreachable
from llmgw.client.client import _failover_order, _moves_on, _translate
from llmgw.dev.process import freeze
from llmgw.pki.ca import CertificateAuthority
from llmgw.reflector import Reflector, object_name
from tests.fixtures.cluster import ApiServer, ca_dir, make_pki, start_api_server  # noqa: F401
from tests.fixtures.poll import until

V1 = "llmgw.io/v1"


def model(name: str) -> Model:
    obj = parse_object({"apiVersion": V1, "kind": "Model", "metadata": {"name": name},
                        "spec": {"replicas": 1, "profiles": [{"engine": "sim"}]}})
    assert isinstance(obj, Model)
    return obj


@pytest.fixture
def servers(etcd, tmp_path):
    """Three servers over the one etcd, each its own process and port."""
    pki = make_pki(tmp_path / "ca")
    started: list[ApiServer] = []
    for i in range(3):
        (tmp_path / f"s{i}").mkdir()
        started.append(start_api_server(pki, etcd.endpoint, tmp_path / f"s{i}"))
    yield started
    for s in started:
        if s.proc.poll() is None:
            os.kill(s.proc.pid, signal.SIGCONT)
        s.stop()


def client_of(servers: list[ApiServer], **kw) -> Client:
    first = servers[0]
    return Client([s.url for s in servers], ca=first.ca, cert=first.admin[0], key=first.admin[1], **kw)


def in_use(servers: list[ApiServer], c: Client) -> ApiServer:
    """The server the client uses now (its order is its own: a hash of its certificate)."""
    return next(s for s in servers if s.url == c.server)


def kill(server: ApiServer) -> None:
    server.proc.kill()
    server.proc.wait()


async def test_requests_move_to_the_next_server_when_one_dies(servers):
    async with client_of(servers) as c:
        await c.create(model("before"))
        assert c.server == c.servers[0]
        kill(in_use(servers, c))
        assert (await c.get(Model, "before")).name == "before"   # answered by the next server
        assert c.server == c.servers[1]
        await c.create(model("after"))                            # and it stays there
        assert c.server == c.servers[1]
        for s in servers:
            if s.proc.poll() is None:
                kill(s)
        with pytest.raises(Unreachable):                          # none left: the last one's error
            await c.get(Model, "after")


async def test_oneshot_requests_move_on_too(servers):
    async with client_of(servers, oneshot=True) as c:
        kill(in_use(servers, c))
        assert (await c.create(model("oneshot"))).name == "oneshot"
        assert c.server == c.servers[1]


@pytest.mark.parametrize("oneshot", [False, True])
async def test_requests_move_on_from_a_frozen_server_within_the_clients_timeout(servers, oneshot):
    """A request given no timeout of its own is held to the client's (aiohttp's timeout=None would
    be none at all: a frozen server would hold it for ever); the next server answers it."""
    async with client_of(servers, oneshot=oneshot, timeout=1.0) as c:
        await c.create(model("frozen"))
        freeze(in_use(servers, c).proc)
        assert (await c.get(Model, "frozen")).name == "frozen"
        assert c.server == c.servers[1]


@pytest.mark.parametrize("oneshot", [False, True])
async def test_heartbeat_moves_on_from_a_frozen_server_within_its_timeout(servers, oneshot):
    """A frozen server (SIGSTOP: it accepts connections and answers nothing) holds a heartbeat for
    the beat's timeout (the agent's interval), not the client's 30 s; the next server answers it."""
    async with client_of(servers, oneshot=oneshot) as c:
        await c.create(Node.model_validate({"metadata": {"name": "hb-frozen"}}))
        await c.heartbeat("hb-frozen", timeout=1.0)
        freeze(in_use(servers, c).proc)
        began = time.monotonic()
        await c.heartbeat("hb-frozen", timeout=1.0)
        assert time.monotonic() - began < 5.0
        assert c.server == c.servers[1]


async def test_a_new_heartbeat_stream_may_take_until_its_deadline(servers):
    """A beat that opens a new stream (the first, or a failover's) is given until `until` where
    that is later than its timeout: a server slow to finish the handshake (here frozen for 2 s, as
    one busy with a fleet's reconnections) answers it, instead of the beat being abandoned and
    redone on the next server. A stream kept open is held to the timeout alone."""
    async with client_of(servers) as c:
        await c.create(Node.model_validate({"metadata": {"name": "hb-slow"}}))
        loop = asyncio.get_running_loop()
        first = in_use(servers, c)
        freeze(first.proc)
        loop.call_later(2.0, first.proc.send_signal, signal.SIGCONT)
        await c.heartbeat("hb-slow", timeout=1.0, until=loop.time() + 10)
        assert c.server == first.url
        freeze(first.proc)
        began = time.monotonic()
        await c.heartbeat("hb-slow", timeout=1.0, until=loop.time() + 10)
        assert time.monotonic() - began < 5.0
        assert c.server == c.servers[1]


def test_clients_spread_over_the_servers_and_a_dead_ones_over_the_others(tmp_path):
    """A client's order is by a hash of its certificate with each URL: clients start on every
    server, the clients of each server go next to each of the others, not all to one, and a
    client's order does not depend on the order the URLs are given in. The spread is counted over
    300 identities (a certificate file's bytes are what is hashed), where each of the six (first,
    second) pairs is missing with a chance of (5/6)^300: 36 of them missed one about once in 120 runs."""
    ca = CertificateAuthority(tmp_path / "ca")
    ca.init()
    urls = [f"https://s{i}:7443" for i in range(3)]
    issued = [ca.issue("node", f"n{i}") for i in range(6)]
    orders = [Client(urls, ca=str(ca.cert_path), cert=i.cert, key=i.key).servers for i in issued]
    assert orders == [_failover_order(urls, i.cert) for i in issued]
    assert [Client(urls[::-1], ca=str(ca.cert_path), cert=i.cert, key=i.key).servers for i in issued] == orders
    assert Client(urls).servers == urls   # no certificate: as given
    identities = []
    for i in range(300):
        (path := tmp_path / f"id{i}.pem").write_text(f"identity {i}")
        identities.append(str(path))
    orders = [_failover_order(urls, path) for path in identities]
    assert all(sorted(o) == urls for o in orders)
    assert {o[0] for o in orders} == set(urls)                              # every server starts some
    assert {(o[0], o[1]) for o in orders} == {(a, b) for a in urls for b in urls if a != b}


async def test_heartbeat_stream_moves_on_when_its_server_dies(servers):
    """The beats' WebSocket to the server in use is cut by its death: the next beat goes to the
    next server at once, not after a timeout."""
    async with client_of(servers) as c:
        await c.create(Node.model_validate({"metadata": {"name": "hb-killed"}}))
        await c.heartbeat("hb-killed", timeout=5.0)     # the stream is open on the server in use
        kill(in_use(servers, c))
        assert await c.heartbeat("hb-killed", timeout=5.0) == {"node": "hb-killed", "ttl": 15}
        assert c.server == c.servers[1]


async def _watch_moves_on(servers: list[ApiServer], stop, **kw) -> None:
    """A reflector's watch through a client of every server; `stop(server)` ends the first one's
    service; a change made meanwhile reaches the reflector from the next server, without a relist."""
    seen: list[tuple[str, str, int]] = []
    async with client_of(servers, **kw) as c, \
            client_of([s for s in servers if s is not in_use(servers, c)]) as writer:
        await writer.create(model("w0"))
        reflector = Reflector(c.lister_watcher(Model), lambda t, o, r: seen.append((t, o.name, r)),
                              key=object_name)
        task = asyncio.create_task(reflector.run())
        try:
            await until(lambda: ("ADDED", "w0") in [(t, n) for t, n, _ in seen], "the list's Model")
            await writer.create(model("w1"))
            await until(lambda: ("ADDED", "w1") in [(t, n) for t, n, _ in seen], "w1 through the first server")
            stop(in_use(servers, c))
            await writer.create(model("w2"))
            await until(lambda: ("ADDED", "w2") in [(t, n) for t, n, _ in seen], "w2 through the next server")
            assert c.server == c.servers[1]
            assert reflector.lists == 1                     # resumed from its revision: no relist
            assert [n for _, n, _ in seen] == ["w0", "w1", "w2"]   # nothing twice, nothing missed
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)


async def test_watch_resumes_on_the_next_server_when_one_dies(servers):
    await _watch_moves_on(servers, kill)


async def test_silent_watch_moves_to_the_next_server(servers):
    # SIGSTOP: the connection stays open and nothing arrives, as from a host that vanished
    await _watch_moves_on(servers, lambda s: freeze(s.proc), watch_idle_timeout=3.0)


async def test_a_watch_cut_once_open_resumes_with_its_backoff_from_the_start(servers):
    """A watch the server had answered, then cut, was established since the last failure: its
    reflector's backoff starts over ("resume"), however quiet it was; one that never opened (its
    server dead) backs off further ("retry")."""
    async with client_of(servers) as c, client_of([in_use(servers, c)]) as stuck:
        created = await c.create(model("quiet"))
        lw = c.lister_watcher(Model)
        stream = lw.watch(created.metadata.resourceVersion)
        assert (await anext(stream)).object.name == "quiet"     # the stream is open
        pending = asyncio.ensure_future(anext(stream))
        kill(in_use(servers, c))
        with pytest.raises(Unreachable) as cut:
            await pending
        assert lw.after_error(cut.value) == "resume"
        refused = stuck.lister_watcher(Model)
        with pytest.raises(Unreachable) as never:
            await anext(refused.watch(created.metadata.resourceVersion))
        assert refused.after_error(never.value) == "retry"


async def test_sigterm_ends_watches_at_once(servers):
    """A server that is stopped tells its watches to go elsewhere (a 503 ERROR line) as soon as it
    stops accepting, not when its shutdown timeout (2 s) cuts them; the next watch goes to the next
    server. Its object and event watches both; and its heartbeat streams (closed, 1001), so the
    next beat goes to the next server, where the stopping server would otherwise have answered
    it on the stream kept open."""
    async with client_of(servers) as c, client_of(servers) as beats:
        await c.create(Node.model_validate({"metadata": {"name": "hb-term"}}))
        await beats.heartbeat("hb-term", timeout=5.0)     # the stream is open on the server in use
        _, rv = await c.list(Model)
        objects = c.watch(Model, resource_version=rv)
        events = c.watch_events(rv + 1)
        first = asyncio.ensure_future(anext(objects))
        second = asyncio.ensure_future(anext(events))
        await asyncio.sleep(0.5)   # both streams open
        began = time.monotonic()
        stopped = in_use(servers, c)     # beats' too: the same certificate, the same order
        assert in_use(servers, beats) is stopped
        stopped.proc.terminate()
        for pending in (first, second):
            with pytest.raises(Unavailable) as err:
                await pending
            assert err.value.reason == "ShuttingDown"
        assert time.monotonic() - began < 2.0
        assert c.server == c.servers[1]
        await beats.heartbeat("hb-term", timeout=5.0)
        assert time.monotonic() - began < 2.0
        assert beats.server == beats.servers[1]
        stopped.proc.wait(10)


def test_config_server_list(tmp_path, ca_dir):
    cert, key = ca_dir.issue("admin", "me")
    path = tmp_path / "config.yaml"
    path.write_text(f"server: [https://a:7443, https://b:7443]\nca: {ca_dir.ca}\ncert: {cert}\nkey: {key}\n")
    cfg = ClientConfig.load(path)
    assert sorted(Client.from_config(cfg).servers) == ["https://a:7443", "https://b:7443"]
    cfg.save(path)
    assert ClientConfig.load(path).server == ["https://a:7443", "https://b:7443"]   # written back as a list
    path.write_text(f"server: [https://a:7443, 3]\nca: {ca_dir.ca}\ncert: {cert}\nkey: {key}\n")
    with pytest.raises(ConfigError, match="server: expected a URL or a list of URLs"):
        ClientConfig.load(path)


def test_agent_takes_several_servers(tmp_path):
    flags = load_config(None, {"server": ("a:7443,https://b", "c")})
    assert flags.server_urls == ["https://a:7443", "https://b:7443", "https://c:7443"]
    path = tmp_path / "agent.yaml"
    path.write_text("server: [https://a:1, b]\n")
    assert load_config(str(path)).server_urls == ["https://a:1", "https://b:7443"]
    assert load_config(str(path)).server_url == "https://a:1"



@pytest.mark.parametrize("cut", [ssl.SSLWantReadError(2, "The operation did not complete (read)"),
                                 ssl.SSLEOFError(8, "EOF occurred in violation of protocol")])
def test_a_tls_connection_cut_midway_moves_on(cut):
    """A server killed during a handshake cuts the connection inside TLS: that is no answer, as a
    refused connection (Unreachable: the next server is tried), not a TLS refusal (raised at once)."""
    err = _translate(cut, "https://a:7443/x")
    assert isinstance(err, Unreachable) and _moves_on(err)

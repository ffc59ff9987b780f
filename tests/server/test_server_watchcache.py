"""The server's shared watch cache (llmgw.server.watchcache): one etcd watch per kind, a ring of
recent events, per-watcher filters and bounded queues, etcd's history behind the window (410
only when compacted), restarts."""
from __future__ import annotations

import asyncio
import json
import ssl
import urllib.request

import aiohttp
import pytest

from llmgw.api import Model, Shard, parse_object
from llmgw.client import BadRequest, Expired, Unavailable
from llmgw.dev.etcd import etcd_cluster
from llmgw.server.watchcache import KindCache
from llmgw.store import Compactor, Store
from tests.fixtures.cluster import ca_dir, make_pki, start_api_server  # noqa: F401
from tests.fixtures.poll import until

V1 = "llmgw.io/v1"


def model(name, labels=None):
    return parse_object({"apiVersion": V1, "kind": "Model", "metadata": {"name": name, "labels": labels or {}},
                         "spec": {"profiles": [{"engine": "sim"}]}})


def node(name):
    return parse_object({"apiVersion": V1, "kind": "Node", "metadata": {"name": name}})


def shard(name, node_name, labels=None):
    return parse_object({"apiVersion": V1, "kind": "Shard", "metadata": {"name": name, "labels": labels or {}},
                         "spec": {"replica": "r", "model": "m", "node": node_name, "rank": 0, "worldSize": 1,
                                  "ports": {"serve": 30000, "distInit": 30001}, "headAddress": "127.0.0.1",
                                  "engine": "sim", "servedModelNames": ["m"]}})


@pytest.fixture(scope="module")
def srv(tmp_path_factory):
    """etcd + `llmgw server --watch-cache-size 4` (so the ring's window is easy to leave)."""
    base = tmp_path_factory.mktemp("watchcache")
    etcd = etcd_cluster(base / "etcd", size=1).start()
    server = start_api_server(make_pki(base / "ca"), etcd.endpoint, base, "--watch-cache-size", "4")
    yield server
    server.stop()
    etcd.stop()


def session(server, identity=None) -> aiohttp.ClientSession:
    ctx = ssl.create_default_context(cafile=server.ca)
    ctx.load_cert_chain(*(identity or server.admin))
    return aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=ctx, limit=0),
                                 timeout=aiohttp.ClientTimeout(total=None, sock_read=60))


async def open_watch(http, server, kind, **params) -> aiohttp.ClientResponse:
    """A raw watch stream; once this returns, the server has subscribed it."""
    params = {"watch": "1", **{k: str(v) for k, v in params.items() if v is not None}}
    resp = await http.get(f"{server.url}/apis/llmgw.io/v1/{kind}", params=params)
    assert resp.status == 200, await resp.text()
    return resp


async def next_line(resp, bookmarks=False) -> tuple[bytes, dict]:
    while True:
        line = await resp.content.readline()
        assert line, "the server ended the watch"
        ev = json.loads(line)
        assert ev["type"] != "ERROR", f"the server ended the watch with {ev['object']}"
        if bookmarks or ev["type"] != "BOOKMARK":
            return line, ev


def etcd_watchers(endpoint: str) -> int:
    """etcd's own count of open watches (a gauge on its /metrics)."""
    with urllib.request.urlopen(f"{endpoint}/metrics", timeout=10) as r:
        for line in r.read().decode().splitlines():
            if line.startswith("etcd_debugging_mvcc_watcher_total "):
                return int(float(line.split()[1]))
    raise AssertionError("etcd exposes no etcd_debugging_mvcc_watcher_total")


async def test_many_watches_share_one_etcd_watch_and_the_same_bytes(srv):
    async with srv.client() as c, session(srv) as http:
        _, rv = await c.list(Model)
        before = await asyncio.to_thread(etcd_watchers, srv.etcd)
        streams = [await open_watch(http, srv, "models", resourceVersion=rv) for _ in range(10)]
        created = await c.create(model("fan"))
        lines = [await next_line(s) for s in streams]
        after = await asyncio.to_thread(etcd_watchers, srv.etcd)
    assert len({line for line, _ in lines}) == 1  # one serialization, the same line for everyone
    ev = lines[0][1]
    assert (ev["type"], ev["object"]["metadata"]["name"]) == ("ADDED", "fan")
    assert ev["revision"] == created.metadata.resourceVersion == ev["object"]["metadata"]["resourceVersion"]
    assert after - before <= 1, f"{after - before} new etcd watches for 10 HTTP watches of one kind"


async def test_resume_inside_the_ring_and_from_etcd_outside_it(srv):
    async with srv.client() as c, session(srv) as http:
        _, rv = await c.list(Model)
        live = await open_watch(http, srv, "models", resourceVersion=rv)
        revs = [(await c.create(model(f"win-{i}"))).metadata.resourceVersion for i in range(6)]
        seen = [(await next_line(live))[1] for _ in range(6)]
        assert [(e["object"]["metadata"]["name"], e["revision"]) for e in seen] == \
            [(f"win-{i}", revs[i]) for i in range(6)]
        # the ring keeps the last 4 events (win-2..win-5): from win-1's revision, all of them
        assert await watched(c, revs[1], 4) == [("ADDED", f"win-{i}", revs[i]) for i in range(2, 6)]
        # from win-0's revision, win-1 left the ring: etcd still has it, so the cache rewinds
        assert await watched(c, revs[0], 5) == [("ADDED", f"win-{i}", revs[i]) for i in range(1, 6)]
        # the open watch is not offered the replay again: its next event is the next change
        later = await c.create(model("win-6"))
        _, ev = await next_line(live)
        assert (ev["object"]["metadata"]["name"], ev["revision"]) == ("win-6", later.metadata.resourceVersion)


async def watched(c, rv: int, count: int) -> list[tuple[str, str, int]]:
    events = []
    async for ev in c.watch(Model, resource_version=rv):
        events.append((ev.type, ev.object.name, ev.revision))
        if len(events) == count:
            return events


async def test_node_scoping_and_label_selector(srv):
    n1 = srv.issue_node("wc-n1")
    async with srv.client() as admin, session(srv) as http, session(srv, n1) as n1_http:
        with pytest.raises(BadRequest):  # models are not keyed by node
            async for _ in admin.watch(Model, node="wc-n1"):
                pass
        _, rv = await admin.list(Shard)
        mine = await open_watch(n1_http, srv, "shards", resourceVersion=rv, node="wc-n1")
        gold = await open_watch(http, srv, "shards", resourceVersion=rv, labelSelector="tier=gold")
        await admin.create(shard("x1", "wc-n1", {"tier": "gold"}))
        await admin.create(shard("x2", "wc-n2", {"tier": "gold"}))
        await admin.patch_status(Shard, "x1", {"phase": "Starting"})
        x2 = await admin.get(Shard, "x2")
        x2.metadata.labels["tier"] = "silver"
        await admin.update(x2)
        x3 = await admin.create(shard("x3", "wc-n1"))
        await admin.create(shard("x4", "wc-n2", {"tier": "gold"}))

        def short(ev):
            return ev["type"], ev["object"]["metadata"]["name"]
        assert [short((await next_line(mine))[1]) for _ in range(3)] == \
            [("ADDED", "x1"), ("MODIFIED", "x1"), ("ADDED", "x3")]
        # x2 left the selector: DELETED for this watcher; x3 never matched
        assert [short((await next_line(gold))[1]) for _ in range(5)] == \
            [("ADDED", "x1"), ("ADDED", "x2"), ("MODIFIED", "x1"), ("DELETED", "x2"), ("ADDED", "x4")]
        _, bookmark = await next_line(mine, bookmarks=True)
        assert bookmark["type"] == "BOOKMARK"
        assert bookmark["revision"] == bookmark["object"]["metadata"]["resourceVersion"]
        assert bookmark["revision"] >= x3.metadata.resourceVersion


async def test_a_slow_watcher_is_closed_with_410_and_others_keep_going(srv):
    async with Store(srv.etcd) as store:
        _, rv = await store.list(Model)
        cache = KindCache(store, "models", size=100, queue_limit=3)
        cache.start(rv)
        try:
            fast, slow = cache.subscribe(rv, who="fast"), cache.subscribe(rv, who="slow")
            fast_stream = fast.stream(idle=60)
            for i in range(6):  # fast reads each event before the next; slow never reads
                created = await store.create(model(f"slow-{i}"))
                ev = json.loads(await fast_stream.__anext__())
                assert (ev["type"], ev["object"]["metadata"]["name"], ev["revision"]) == \
                    ("ADDED", f"slow-{i}", created.metadata.resourceVersion)
            slow_stream = slow.stream(idle=60)
            ev = json.loads(await slow_stream.__anext__())
            assert ev["type"] == "ERROR"
            assert (ev["object"]["code"], ev["object"]["reason"]) == (410, "Expired")
            assert "more than 3 events behind" in ev["object"]["message"]
            with pytest.raises(StopAsyncIteration):
                await slow_stream.__anext__()
            assert cache.watcher_count() == 1
            # resuming with more history than the limit is not slowness: the backlog is allowed
            late = cache.subscribe(rv, who="late")
            backlog = [json.loads(line) for line in (await late.stream(idle=60).__anext__()).splitlines()]
            assert [e["object"]["metadata"]["name"] for e in backlog] == [f"slow-{i}" for i in range(6)]
        finally:
            await cache.stop()


async def test_events_of_one_transaction_all_reach_a_watcher_and_a_rewind_repeats_none(srv):
    """Concurrent writes share a transaction, so several events can have one revision."""
    async with Store(srv.etcd) as store:
        _, rv = await store.list(Model)
        filler = await store.create(model("txn-before"))
        cache = KindCache(store, "models", size=100, queue_limit=100)
        cache.start(filler.metadata.resourceVersion)   # as if its first watch came from a later list
        try:
            async def read(w, count):
                stream, names = w.stream(idle=60), []
                while len(names) < count:
                    for line in (await stream.__anext__()).splitlines():
                        ev = json.loads(line)
                        assert ev["type"] in ("ADDED", "MODIFIED"), f"{ev['type']} after {names}: an event was lost"
                        names.append(ev["object"]["metadata"]["name"])
                return names
            live = cache.subscribe(filler.metadata.resourceVersion)
            made = await asyncio.gather(*(store.create(model(f"txn-{i}")) for i in range(8)))
            assert len({m.metadata.resourceVersion for m in made}) < 8, "no two writes shared a transaction"
            assert sorted(await read(live, 8)) == sorted(m.name for m in made)
            old = cache.subscribe(rv)           # older than the cache: it rewinds to rv
            assert sorted(await read(old, 9)) == sorted([filler.name] + [m.name for m in made])
            late = await store.create(model("txn-late"))
            assert await read(live, 1) == ["txn-late"], "the open watch was sent the replay again"
            assert (await read(old, 1)) == [late.name]
        finally:
            await cache.stop()


async def test_the_cache_starts_over_when_its_history_was_compacted(srv):
    async with Store(srv.etcd) as store:
        rv = await store.revision()
        await store.create(node("gone-1"))
        await store.create(node("gone-2"))
        await Compactor(store.etcd, keep=1).compact()
        cache = KindCache(store, "nodes", size=100, queue_limit=100)
        cache.start(rv)  # its first watch, from rv + 1, finds that history gone
        try:
            old = cache.subscribe(rv)
            ev = json.loads(await old.stream(idle=60).__anext__())
            assert ev["type"] == "ERROR" and (ev["object"]["code"], ev["object"]["reason"]) == (410, "Expired")
            assert cache.rev > rv and cache.watcher_count() == 0
            fresh = cache.subscribe(cache.rev)
            created = await store.create(node("after-relist"))
            ev = json.loads(await fresh.stream(idle=60).__anext__())
            assert (ev["type"], ev["object"]["metadata"]["name"], ev["revision"]) == \
                ("ADDED", "after-relist", created.metadata.resourceVersion)
        finally:
            await cache.stop()


def restart_etcd(cluster) -> None:
    m = cluster.members[0]
    cluster.stop_member(m)
    cluster.restart(m, 60)  # same data dir and ports


async def test_open_watches_survive_an_etcd_restart(etcd, ca_dir, tmp_path):
    server = start_api_server(ca_dir, etcd.endpoint, tmp_path)
    try:
        async with server.client() as c, session(server) as http:
            _, rv = await c.list(Model)
            stream = await open_watch(http, server, "models", resourceVersion=rv)
            await asyncio.to_thread(restart_etcd, etcd)
            created = await until(lambda: c.create(model("after-restart")), "the server's etcd client to reconnect",
                                  interval=0.2, retry=(Unavailable,))
            # the same stream goes on: no ERROR, the event arrives
            _, ev = await next_line(stream)
            assert (ev["type"], ev["object"]["metadata"]["name"], ev["revision"]) == \
                ("ADDED", "after-restart", created.metadata.resourceVersion)
        assert server.wait_for_log("watch cache of models interrupted")
    finally:
        server.stop()


async def test_a_restarted_server_resumes_old_watches_from_etcd_and_410s_only_compacted_ones(etcd, ca_dir, tmp_path):
    """After a restart the cache starts at its first watch's revision; an older resumed watch is
    served from etcd's history (no relist storm); only a compacted revision gets 410."""
    server = start_api_server(ca_dir, etcd.endpoint, tmp_path)
    try:
        async with server.client() as c:
            _, old_rv = await c.list(Model)
            made = [await c.create(model(f"back-{i}")) for i in range(3)]
        server.restart()
        async with server.client() as c, session(server) as http:
            _, now_rv = await c.list(Model)
            first = await open_watch(http, server, "models", resourceVersion=now_rv)  # starts the cache
            assert await watched(c, old_rv, 3) == [
                ("ADDED", f"back-{i}", m.metadata.resourceVersion) for i, m in enumerate(made)]
            after = await c.create(model("back-after"))
            _, ev = await next_line(first)
            assert (ev["object"]["metadata"]["name"], ev["revision"]) == ("back-after", after.metadata.resourceVersion)

            async with Store(etcd.endpoint) as store:
                await Compactor(store.etcd, keep=1).compact()
            with pytest.raises(Expired) as err:
                async for ev in c.watch(Model, resource_version=old_rv):
                    pytest.fail(f"a watch from a compacted revision got {ev.type} {ev.object.name}")
            assert err.value.code == 410 and "compacted" in str(err.value)
    finally:
        server.stop()

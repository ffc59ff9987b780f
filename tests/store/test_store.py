"""llmgw.store against a real etcd."""
from __future__ import annotations

import asyncio
import json
import signal
import subprocess
from unittest.mock import ANY

import pytest

from llmgw.api import Model, ModelStatus, Node, ObjectMeta, Shard, parse_object
from llmgw.dev.process import freeze
from llmgw.store import AlreadyExists, Compacted, Compactor, Conflict, FencedOut, NotFound, Store, StoreUnavailable
from tests.fixtures.poll import until


def model(name: str, replicas: int = 1, labels: dict | None = None) -> Model:
    return parse_object({
        "apiVersion": "llmgw.io/v1", "kind": "Model",
        "metadata": {"name": name, "labels": labels or {}},
        "spec": {"replicas": replicas, "profiles": [{"engine": "sim"}]},
    })


def shard(name: str, node: str) -> Shard:
    return parse_object({
        "apiVersion": "llmgw.io/v1", "kind": "Shard", "metadata": {"name": name},
        "spec": {"replica": "r1", "model": "m1", "node": node, "rank": 0, "worldSize": 1,
                 "ports": {"serve": 30000, "distInit": 30001}, "headAddress": "127.0.0.1",
                 "engine": "sim", "servedModelNames": ["m1"]},
    })


async def test_create_get_and_keys_readable_with_etcdctl(store, etcd):
    created = await store.create(model("m1"))
    assert created.metadata.generation == 1 and created.metadata.uid
    got = await store.get(Model, "m1")
    assert got.metadata.resourceVersion == created.metadata.resourceVersion
    with pytest.raises(AlreadyExists):
        await store.create(model("m1"))
    with pytest.raises(NotFound):
        await store.get(Model, "nope")

    def stored() -> list[str]:
        return subprocess.run(["etcdctl", "--endpoints", etcd.endpoint, "get", "--prefix", "/llmgw/"],
                              capture_output=True, text=True, env={"ETCDCTL_API": "3"},
                              check=True).stdout.split("\n")

    out = stored()
    # created with the default status: no status key until the status is first written
    assert "/llmgw/spec/models/m1" in out and "/llmgw/status/models/m1" not in out
    spec_doc = json.loads(out[out.index("/llmgw/spec/models/m1") + 1])
    assert spec_doc["spec"]["replicas"] == 1 and "status" not in spec_doc
    assert got.status == ModelStatus() and got.status.replicas == 0
    await store.patch_status(Model, "m1", {"replicas": 1})
    out = stored()
    assert json.loads(out[out.index("/llmgw/status/models/m1") + 1])["replicas"] == 1


async def test_a_create_sent_again_after_it_committed_is_done_not_already_exists(store):
    """Connection.call sends a write again to the next member when the first died before it
    answered; a create that had committed then meets itself (the same uid) and is done. The
    model controller answered AlreadyExists with yet another replica (surge past maxSurge)."""
    first = await store.create(model("m1"))
    resent = model("m1", replicas=1)
    resent.metadata.uid = first.metadata.uid
    again = await store.create(resent)
    assert again.metadata.uid == first.metadata.uid
    assert again.metadata.resourceVersion == first.metadata.resourceVersion
    with pytest.raises(AlreadyExists):      # another object of the same name is still refused
        await store.create(model("m1"))


async def test_concurrent_writers_lose_no_update(store):
    await store.create(model("m1", replicas=0))

    async def bump():
        while True:
            m = await store.get(Model, "m1")
            m.spec.replicas += 1
            try:
                await store.update(m)
                return
            except Conflict:
                continue

    await asyncio.gather(*(bump() for _ in range(20)))
    final = await store.get(Model, "m1")
    assert final.spec.replicas == 20
    assert final.metadata.generation == 21


async def test_stale_update_conflicts(store):
    m = await store.create(model("m1"))
    fresh = m.model_copy(deep=True)
    fresh.spec.replicas = 3
    await store.update(fresh)
    m.spec.replicas = 5
    with pytest.raises(Conflict):
        await store.update(m)


async def test_status_write_moves_neither_generation_nor_resource_version(store):
    m = await store.create(model("m1"))
    m.status.readyReplicas = 7
    after = await store.update_status(m)
    got = await store.get(Model, "m1")
    assert got.status.readyReplicas == 7 == after.status.readyReplicas
    assert got.metadata.generation == 1
    assert got.metadata.resourceVersion == m.metadata.resourceVersion


async def test_every_copy_knows_the_revision_it_reflects(store):
    """resourceVersion is the spec's; obj.revision orders copies across status writes too."""
    created = await store.create(model("m1"))
    _, rev = await store.list(Model)
    patched = await store.patch_status(Model, "m1", {"readyReplicas": 3})
    assert patched.metadata.resourceVersion == created.metadata.resourceVersion
    assert patched.revision > created.revision == created.metadata.resourceVersion
    (event,) = await collect(store.watch(Model, from_revision=rev + 1), 1)
    assert event.revision == event.object.revision == patched.revision
    assert (await store.get(Model, "m1")).revision == patched.revision
    (listed,), _ = await store.list(Model)
    assert listed.revision == patched.revision
    relabelled = created.model_copy(deep=True)
    relabelled.metadata.labels["team"] = "a"
    updated = await store.update(relabelled)
    assert updated.revision == updated.metadata.resourceVersion > patched.revision
    assert (await store.get(Model, "m1")).revision == updated.revision


async def test_unchanged_update_writes_nothing(store):
    m = await store.create(model("m1"))
    again = await store.update(m)
    assert again.metadata.resourceVersion == m.metadata.resourceVersion
    m.metadata.labels["team"] = "a"
    labelled = await store.update(m)
    assert labelled.metadata.generation == 1  # metadata change: generation stays
    assert labelled.metadata.resourceVersion > m.metadata.resourceVersion


async def test_patch_status_merges_conditions(store):
    await store.create(Node(metadata=ObjectMeta(name="n1")))
    await store.patch_status(Node, "n1", {"agentVersion": "1", "conditions": [
        {"type": "Ready", "status": "True", "reason": "AgentReady"},
        {"type": "GPUDiscovery", "status": "True"}]})
    n = await store.patch_status(Node, "n1", {"conditions": [
        {"type": "Ready", "status": "False", "reason": "HeartbeatExpired"}]})
    conds = {c.type: c for c in n.status.conditions}
    assert conds["Ready"].status == "False" and conds["GPUDiscovery"].status == "True"
    assert n.status.agentVersion == "1"


async def test_finalizers_delay_delete(store):
    m = model("m1")
    m.metadata.finalizers = ["llmgw.io/test"]
    await store.create(m)
    marked = await store.delete(Model, "m1")
    assert marked.metadata.deletionTimestamp is not None
    got = await store.get(Model, "m1")
    assert got.metadata.deletionTimestamp is not None
    got.metadata.finalizers = []
    await store.update(got)
    with pytest.raises(NotFound):
        await store.get(Model, "m1")


async def test_shards_keyed_by_node(store):
    await store.create(shard("s1", "node-a"))
    await store.create(shard("s2", "node-b"))
    items, _ = await store.list(Shard, node="node-a")
    assert [s.name for s in items] == ["s1"]
    assert (await store.get(Shard, "s2")).spec.node == "node-b"  # found without the node
    assert (await store.kv.get("/llmgw/spec/shards/node-b/s2")) is not None


async def test_list_selector(store):
    await store.create(model("a", labels={"team": "x"}))
    await store.create(model("b", labels={"team": "y"}))
    items, rev = await store.list(Model, selector="team=x")
    assert [m.name for m in items] == ["a"] and rev > 0
    items, _ = await store.list(Model, selector="team!=x")
    assert [m.name for m in items] == ["b"]


async def collect(agen, n, timeout=10):
    out = []

    async def run():
        async for ev in agen:
            out.append(ev)
            if len(out) == n:
                return
    await asyncio.wait_for(run(), timeout)
    return out


async def test_watch_from_revision(store):
    m = await store.create(model("m1"))
    _, rev = await store.list(Model)
    m.spec.replicas = 2
    m = await store.update(m)
    m.status.readyReplicas = 1
    await store.update_status(m)
    await store.create(model("m2"))
    await store.delete(Model, "m2")
    events = await collect(store.watch(Model, from_revision=rev + 1), 4)
    assert [(e.type, e.object.name) for e in events] == [
        ("MODIFIED", "m1"), ("MODIFIED", "m1"), ("ADDED", "m2"), ("DELETED", "m2")]
    assert events[0].object.spec.replicas == 2
    assert events[1].object.status.readyReplicas == 1 and events[1].object.spec.replicas == 2
    # from revision 1 the whole history replays, creation included
    first = await collect(store.watch(Model, from_revision=1), 1)
    assert first[0].type == "ADDED" and first[0].object.name == "m1"


async def test_every_watched_copy_is_the_object_as_stored_at_its_revision(store):
    """Status events reuse the spec they follow; each copy must still be what a get would have read."""
    await store.create(model("m1"))
    _, rev = await store.list(Model)
    m = await store.patch_status(Model, "m1", {"readyReplicas": 1})
    m = m.model_copy(deep=True)
    m.metadata.labels["team"] = "a"
    m.spec.replicas = 3
    await store.update(m)
    await store.patch_status(Model, "m1", {"readyReplicas": 2, "conditions": [
        {"type": "Ready", "status": "True", "reason": "Up"}]})
    events = await collect(store.watch(Model, from_revision=rev + 1), 3)
    seen = [(e.object.metadata.labels.get("team"), e.object.spec.replicas, e.object.metadata.generation,
             e.object.status.readyReplicas, e.object.revision) for e in events]
    assert seen == [(None, 1, 1, 1, events[0].revision), ("a", 3, 2, 1, events[1].revision),
                    ("a", 3, 2, 2, events[2].revision)]
    assert events[2].object == await store.get(Model, "m1")


async def test_a_watch_from_any_revision_gives_each_write_once_as_it_was_stored(store):
    """Objects created with and without a status (a default one is not stored), first status
    writes, spec changes and deletes: a watch started at any revision yields one event per
    write after it, each object equal to what that write returned (the revisions of its spec
    and status keys included), whether the watch saw the object's creation or not."""
    written = []   # each object as its write returned it
    n1 = await store.create(Node(metadata=ObjectMeta(name="n1")))                     # no status key
    written.append(n1)
    n2 = await store.create(Node(metadata=ObjectMeta(name="n2"), status={"agentVersion": "1"}))  # status too
    written.append(n2)
    written.append(n1 := await store.patch_status(Node, "n1", {"agentVersion": "2"}, current=n1))
    cordoned = n2.model_copy(update={"spec": n2.spec.model_copy(update={"unschedulable": True})})
    written.append(n2 := await store.update(cordoned, current=n2))
    written.append(n2 := await store.patch_status(Node, "n2", {"driverVersion": "570"}, current=n2))
    written.append(n1 := await store.update(n1.model_copy(update={"spec": n1.spec.model_copy(
        update={"drain": True})}), current=n1))
    written.append(n1 := await store.patch_status(Node, "n1", {"addresses": ["10.0.0.1"]}, current=n1))
    written.append(await store.delete(Node, "n2"))
    revisions = [o.revision for o in written]
    assert revisions == sorted(set(revisions)), "one revision per write"
    for i, start in enumerate(revisions):
        events = await collect(store.watch(Node, from_revision=start), len(written) - i)
        types = ["ADDED", "ADDED", "MODIFIED", "MODIFIED", "MODIFIED", "MODIFIED", "MODIFIED", "DELETED"]
        assert [(e.type, e.revision) for e in events] == [
            (t, o.revision) for t, o in zip(types[i:], written[i:], strict=True)]
        for e, o in zip(events, written[i:], strict=True):
            if e.type == "DELETED":
                assert e.object.name == o.name and e.object.spec == o.spec
            else:
                assert e.object == o, (start, e.revision)
                assert e.object.revision == o.revision and e.object._status_revision == o._status_revision


async def test_a_watchers_own_writes_come_back_as_the_copies_it_holds(store, etcd):
    """With held= (the watcher's cache), the event of a write whose result the watcher holds
    carries that copy instead of a decoded one; another writer's change, or a held copy that
    is not what the change wrote, is decoded. Each event equals the object as stored."""
    n = await store.create(Node(metadata=ObjectMeta(name="n1")))
    cache = {"n1": n}
    events = store.watch(Node, from_revision=n.revision, held=cache.get).__aiter__()
    assert (await anext(events)).object == n     # a create is decoded: the held copy is the writer's input
    cache["n1"] = n = await store.patch_status(Node, "n1", {"agentVersion": "1"}, current=n)
    assert (await anext(events)).object is n
    async with Store(etcd.endpoint) as other:
        theirs = await other.patch_status(Node, "n1", {"driverVersion": "570"})
    ev = await anext(events)
    assert ev.object is not n and ev.object == theirs             # not held: decoded
    # an update from a copy whose status is older than the stored one: its spec, the stored status
    cordoned = n.model_copy(update={"spec": n.spec.model_copy(update={"unschedulable": True})})
    cache["n1"] = mine = await store.update(cordoned, current=n)
    ev = await anext(events)
    assert ev.object is not mine and ev.object.spec.unschedulable and ev.object.status.driverVersion == "570"
    assert ev.object == await store.get(Node, "n1")
    cache["n1"] = n = await store.patch_status(Node, "n1", {"agentVersion": "2"}, current=ev.object)
    assert (await anext(events)).object is n
    assert n == await store.get(Node, "n1")


async def test_watch_compacted_start_is_signalled(store):
    m = await store.create(model("m1"))
    for i in range(5):
        m.spec.replicas = i + 2
        m = await store.update(m)
    rev = await Compactor(store.etcd, keep=1).compact()
    assert rev is not None
    with pytest.raises(Compacted):
        await collect(store.watch(Model, from_revision=2), 1)


async def test_fenced_writes_fail_after_leadership_changes(store):
    lead = await store.election.campaign("controller-manager", "a", ttl=5)
    assert lead is not None
    assert await store.election.campaign("controller-manager", "b", ttl=5) is None
    fenced = store.fenced(lead.key, lead.create_revision)
    await fenced.create(model("m1"))
    await lead.resign()
    other = await store.election.campaign("controller-manager", "b", ttl=5)
    assert other is not None
    with pytest.raises(FencedOut):
        await fenced.create(model("m2"))
    m = await store.get(Model, "m1")
    m.spec.replicas = 4
    with pytest.raises(FencedOut):
        await fenced.update(m)


async def test_a_standby_hears_the_leader_key_go_though_history_was_compacted_since_it_was_taken(store):
    """A standby watches the leader key from its read, not from the key's last write: etcd need
    not send it through the history since (a fleet's writes, each time it watches anew), nor can
    that history be compacted away under it."""
    lead = await store.election.campaign("controller-manager", "a", ttl=5)
    assert lead is not None
    for i in range(3):
        await store.kv.put(f"/bench/k{i}", b"x")
    assert await Compactor(store.etcd, keep=1).compact() is not None
    vacated = asyncio.create_task(store.election.vacated("controller-manager"))
    await asyncio.sleep(0.5)
    assert not vacated.done()   # watching, not failed on a compacted revision
    await lead.resign()
    await asyncio.wait_for(vacated, 5)


async def test_heartbeat_expires_with_its_lease(store):
    await store.heartbeats.beat("n1", ttl=1)
    assert "n1" in await store.heartbeats.list()
    async def expired():
        return "n1" not in await store.heartbeats.list()
    await until(expired, "n1's heartbeat to expire with its lease")
    await store.heartbeats.beat("n1", ttl=5)  # a new lease after expiry
    assert "n1" in await store.heartbeats.list()


async def test_beats_share_a_lease_yet_a_silent_node_expires_alone(store):
    """The beats of one window go to etcd as one write on one lease; a node that beats again is
    bound to the next lease, its value kept, and a watcher of the live heartbeats hears of it
    once a write, as the first key of it (what moves its revision on), not once a key; its
    lease-mate that went silent expires with the old lease."""
    async def lease(node: str) -> int:
        return (await store.etcd.range(f"/llmgw/heartbeat/{node}")).kvs[0].lease
    await asyncio.gather(store.heartbeats.beat("a", ttl=2, info={"agent": "1"}), store.heartbeats.beat("b", ttl=2))
    assert await lease("a") == await lease("b")
    first = (await store.heartbeats.list())["a"]
    assert first["agent"] == "1"
    _, revision = await store.kv.list("/llmgw/heartbeat/")
    events = store.heartbeats.lister_watcher().watch(revision + 1)
    for _ in range(8):   # 4 s: twice the ttl
        await asyncio.gather(store.heartbeats.beat("a", ttl=2), *(store.heartbeats.beat(f"c{i}", ttl=2)
                                                                   for i in range(10)))
        await asyncio.sleep(0.5)
    assert await store.heartbeats.list() == {"a": first, **{f"c{i}": ANY for i in range(10)}}
    seen = []
    while (ev := await asyncio.wait_for(anext(events), 5))[:2] != ("DELETED", "b"):
        seen.append(ev)
    await events.aclose()
    writes: dict[int, list[tuple[str, str]]] = {}
    for type_, name, rev in seen:
        writes.setdefault(rev, []).append((type_, name))
    # the first write: a re-bound (its first key) and the c's written anew, each; the later
    # writes, of the eleven keys re-bound, one ADDED each
    first, *later = writes.values()
    assert sorted(name for _, name in first) == ["a", *(f"c{i}" for i in range(10))]
    assert later and all(len(w) == 1 and w[0][0] == "ADDED" for w in later) and len(writes) <= 8


async def test_beats_gather_a_tenth_of_their_ttl(store):
    """The default ttl's beats (15 s) gather 1.5 s before they are written (a write costs the
    server as much whatever the beats in it): two beats 0.4 s apart, the first 0.6 s after a
    write, share the next write's lease (at 0.5 s, the first would have been written at once)."""
    async def lease(node: str) -> int:
        return (await store.etcd.range(f"/llmgw/heartbeat/{node}")).kvs[0].lease
    await store.heartbeats.beat("x", ttl=15)
    await asyncio.sleep(0.6)
    y = asyncio.ensure_future(store.heartbeats.beat("y", ttl=15))
    await asyncio.sleep(0.4)
    await asyncio.gather(y, store.heartbeats.beat("z", ttl=15))
    assert await lease("y") == await lease("z") != await lease("x")


async def test_events_and_revocations(store):
    await store.events.record("models", "m1", "Normal", "Scheduled", "placed on n1")
    await store.events.record("models", "m1", "Warning", "Unschedulable", "0/1 nodes")
    events = await store.events.list("models", "m1")
    assert [e["reason"] for e in events] == ["Scheduled", "Unschedulable"]
    # one transaction, several events of one object: all kept, in order
    await store.events.record_many([("models", "m1", "Normal", f"Step{i}", "") for i in range(50)]
                              + [("nodes", "n1", "Normal", "Registered", "")])
    events = await store.events.list("models", "m1")
    assert [e["reason"] for e in events] == ["Scheduled", "Unschedulable"] + [f"Step{i}" for i in range(50)]
    assert [e["reason"] for e in await store.events.list("nodes", "n1")] == ["Registered"]
    await store.revocations.add("abc123", {"node": "n1"})
    assert (await store.revocations.list())["abc123"]["node"] == "n1"


async def test_an_event_lease_gone_is_granted_anew(store):
    """The lease events are written on, gone from etcd (etcd restored from a snapshot taken before
    it was granted; here revoked): the next event is written on a new one."""
    await store.events.record("models", "m1", "Normal", "Scheduled", "placed on n1")
    lease_id = store._event_stamps.lease[0]
    await store.leases.revoke(lease_id)
    await store.leases.revoke(lease_id)   # a lease gone is no error to revoke (a demand report withdrawn as
    # its lease expired: llmgw/store/demand.py)
    await store.events.record("models", "m1", "Normal", "Ready", "")
    assert [e["reason"] for e in await store.events.list("models", "m1")] == ["Ready"]


async def test_three_members_survive_one_stopping(etcd3):
    s = Store(etcd3.endpoints)
    await s.connect()
    try:
        await s.create(model("m1"))
        etcd3.stop_member(etcd3.members[0])  # the endpoint the store is talking to
        await s.create(model("m2"))
        items, _ = await s.list(Model)
        assert sorted(m.name for m in items) == ["m1", "m2"]
    finally:
        await s.close()


async def test_without_a_quorum_every_read_fails_as_store_unavailable(etcd3):
    """A member without a quorum lets a request's deadline end inside etcd, which answers gRPC
    UNKNOWN "context deadline exceeded" (about a third of the reads at these short deadlines, the
    rest end at the client as DEADLINE_EXCEEDED). Both must be StoreUnavailable: the error a
    caller retries, and the one `connect(wait=)` waits through (a controller-manager started
    just as a quorum came back exited on the raw gRPC error in the soak)."""
    alive = etcd3.members[2]
    s = Store(alive.endpoint, timeout=0.3)
    await s.connect()
    stopped = [m.proc for m in etcd3.members[:2]]
    for proc in stopped:
        freeze(proc)    # stopped, every thread: os.kill's SIGSTOP let them answer the first read
    try:
        for _ in range(20):
            with pytest.raises(StoreUnavailable):
                await s.revision()
    finally:
        for proc in stopped:
            proc.send_signal(signal.SIGCONT)
        await s.close()


async def test_watch_from_a_compacted_deletion_is_signalled(store):
    """etcd drops a deletion made at exactly the compaction revision; the watch must not miss it silently."""
    await store.create(model("m1"))
    gone = await store.delete(Model, "m1")
    deleted_at = gone.metadata.resourceVersion
    await store.etcd.compact(deleted_at)
    with pytest.raises(Compacted):
        await collect(store.watch(Model, from_revision=deleted_at), 1)
    # one revision later is still fine
    await store.create(model("m2"))
    events = await collect(store.watch(Model, from_revision=deleted_at + 1), 1)
    assert events[0].object.name == "m2"


async def test_patch_status_from_a_stale_memory_loses_nothing(store, etcd):
    """A store that remembers an old status must not overwrite another writer's patch."""
    await store.create(Node(metadata=ObjectMeta(name="n1")))
    await store.patch_status(Node, "n1", {"agentVersion": "1"})  # remembered at this revision
    async with Store(etcd.endpoint) as other:
        await other.patch_status(Node, "n1", {"driverVersion": "570"})
    n = await store.patch_status(Node, "n1", {"conditions": [{"type": "Ready", "status": "True"}]})
    assert (n.status.agentVersion, n.status.driverVersion) == ("1", "570")
    assert (await store.get(Node, "n1")).status.driverVersion == "570"


async def test_patch_status_of_a_held_copy_returns_the_stored_spec_and_loses_no_status(store, etcd):
    """With current=, the result is built from the caller's copy only while its spec is the stored one."""
    held = await store.create(Node(metadata=ObjectMeta(name="n1")))
    n = await store.patch_status(Node, "n1", {"agentVersion": "1"}, current=held)
    assert n.status.agentVersion == "1" and n.metadata.resourceVersion == held.metadata.resourceVersion
    assert n.revision > held.revision
    async with Store(etcd.endpoint) as other:
        cordoned = (await other.get(Node, "n1")).model_copy(deep=True)
        cordoned.spec.unschedulable = True
        cordoned = await other.update(cordoned)  # the spec moves on; the status this store knows is current
        n = await store.patch_status(Node, "n1", {"driverVersion": "570"}, current=held)
        assert n.spec.unschedulable is True and n.metadata.resourceVersion == cordoned.metadata.resourceVersion
        await other.patch_status(Node, "n1", {"addresses": ["10.0.0.1"]})  # now the status moves on
    n = await store.patch_status(Node, "n1", {"conditions": [{"type": "Ready", "status": "True"}]},
                                 current=n)
    assert (n.status.agentVersion, n.status.driverVersion, n.status.addresses) == ("1", "570", ["10.0.0.1"])
    stored = await store.get(Node, "n1")
    assert stored == n and stored.revision == n.revision


def test_etcd_starts_on_other_ports_when_its_port_is_taken_first(tmp_path):
    """free_port's answer can be taken by another process before etcd binds it."""
    import socket

    from llmgw.dev.etcd import etcd_cluster
    cluster = etcd_cluster(tmp_path, size=1)
    taken = cluster.members[0].client_port
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", taken))
        squatter.listen()
        cluster.start()
        try:
            assert cluster.members[0].client_port != taken
            assert b"address already in use" in cluster.members[0].log_path.read_bytes()
        finally:
            cluster.stop()

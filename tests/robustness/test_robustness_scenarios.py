"""Fault-injection scenarios (the short profile): a real cluster, a load through the gateway, a
nemesis, then the invariants over the recorded history (see invariants.py, docs/robustness.md).

Each scenario has its own cluster (3 nodes x 2 fake GPUs unless it says otherwise, node grace
3 s, two controller-managers). The scenarios named for issue 21's cases
failed, before their fixes, on the invariant each bug breaks.
"""
from __future__ import annotations

import asyncio
import contextlib
import time
from collections import Counter

import aiohttp
import pytest

from llmgw.api import ApiKey, Model, Node
from llmgw.api.secrets import new_secret
from llmgw.api.wellknown import DRAINING_REPLACEMENT_FOR
from llmgw.cli.create import build_key
from llmgw.client.client import _failover_order
from llmgw.reflector import Reflector, object_name
from tests.fixtures.snapshot import save
from tests.robustness import invariants as inv
from tests.robustness import nemesis
from tests.robustness.harness import fault_cluster, node_plans

pytestmark = [pytest.mark.timeout(600), pytest.mark.faults]   # a cluster each: two at a time, after the parallel run

ORPHAN_BOUND = 30.0   # s an engine may outlive its shard: drain delay + stop grace + a loaded machine


def common(c, model: str, replicas: int, max_surge: int = 1) -> dict:
    """The invariants every scenario must keep."""
    h = c.history
    return {"exclusive_engines": inv.exclusive_engines(h),
            "surge_bound": inv.surge_bound(h, model, replicas, max_surge),
            "no_orphans": inv.no_orphans(h, ORPHAN_BOUND),
            "ready_on_own_engine": inv.ready_on_own_engine(h),
            "ports_free_when_given": inv.ports_free_when_given(h),
            "converged": inv.converged(h)}


def serving(c, model: str, replicas: int, start: float, end: float) -> dict:
    """The common invariants, and: no request failed, and from start to end no fewer than all Ready."""
    return {**common(c, model, replicas), "no_failed_requests": inv.no_failed_requests(c.history),
            "ready_floor": inv.ready_floor(c.history, model, replicas, [(start, end)])}


@contextlib.asynccontextmanager
async def with_model(tmp_path, replicas: int, args: list[str] | None = None, **cluster):
    """A cluster (fault_cluster's options) with model m's `replicas` Ready (its engines given `args`)."""
    async with fault_cluster(tmp_path, **cluster) as c:
        await c.apply_model("m", replicas=replicas, args=args)
        await c.wait_model_ready("m", replicas)
        yield c


@contextlib.asynccontextmanager
async def under_load(tmp_path, replicas: int = 2, **cluster):
    """A cluster serving model m (200 tokens a second) under load, three clients of whole responses
    and two of 300-token streams (1.5 s each, so faults land mid-stream); after the body: settle,
    then the `serving` invariants with the body's time as the window in which every replica must
    stay Ready."""
    async with with_model(tmp_path, replicas, args=["--tokens-per-second", "200"], **cluster) as c:
        async with c.load(["m"], streams=2):
            start = time.monotonic()
            yield c
            await c.settle({"m": replicas})
            end = time.monotonic()
        c.holds(**serving(c, "m", replicas, start, end))


def served_during(c, fault: str, back: str) -> None:
    """Assert the load and the recorder ran on while the fault was on: a request ended between
    the last `fault` and the `back` after it (a nemesis that blocked the event loop would show
    none: the clients and the watches pause exactly while it waits)."""
    t0 = max(f.t for f in c.history.faults if f.nemesis == fault)
    t1 = min(f.t for f in c.history.faults if f.nemesis == back and f.t >= t0)
    ended = [r for r in c.history.requests if t0 < r.end < t1]
    assert ended, f"no request ended during {fault} .. {back} ({t1 - t0:.2f}s): the load paused with the fault"


async def victim_of(c) -> str:
    """A node hosting a replica of m."""
    return (await c.replicas("m"))[0].spec.placement[0].node


async def test_drain_under_load_loses_no_request(tmp_path):
    async with under_load(tmp_path) as c:
        victim = await victim_of(c)
        await c.drain(victim)
        await c.wait_drained(victim)


async def test_rolling_update_under_load_keeps_ready_floor_and_surge(tmp_path):
    async with under_load(tmp_path) as c:
        old = {r.name for r in await c.replicas("m")}
        await c.set_args("m", ["--tokens-per-second", "400"])
        await c.wait_rolled("m", old, 2)


async def test_leader_kill_mid_drain_makes_one_replacement(tmp_path):
    async with under_load(tmp_path) as c:
        victim = await victim_of(c)
        await c.drain(victim)

        async def replacing():
            return any(DRAINING_REPLACEMENT_FOR in r.metadata.annotations for r in await c.replicas("m"))
        await c.wait("a drain replacement", replacing)
        await nemesis.kill_leader(c)
        await c.wait_drained(victim)


async def test_agent_kill_and_restart_keeps_engines_and_requests(tmp_path):
    async with under_load(tmp_path) as c:
        victim = await victim_of(c)
        before = {e.pid for e in c.engine_processes(victim)}
        nemesis.kill_agent(c, victim)
        nemesis.restart_agent(c, victim)

        async def adopted():
            shards = await c.shards(victim)
            return shards and all(s.status.phase == "Ready" for s in shards) and \
                (await c.node_condition(victim, "Ready")) == "True"
        await c.wait(f"{victim}'s agent back with its shards Ready", adopted)
        assert {e.pid for e in c.engine_processes(victim)} == before, "the restarted agent did not adopt its engines"


async def test_server_kills_lose_nothing(tmp_path):
    """One of three servers SIGKILLed and started again half a second later, each in turn, under
    load: no request fails, no Node is written Ready=False (the agents' beats moved to a live
    server within the node grace, 3 s), a watch through the servers (a reflector of Nodes over the
    admin's client, which names all three) resumes on the next server each time without a relist,
    and the control plane works after. One node, one replica: the scenario is the servers', kept
    short (17 s here). (One server killed alone: test_restarted_server_resumes_watches.)"""
    async with under_load(tmp_path, replicas=1, nodes=1, servers=3) as c:
        names: list[str] = []
        reflector = Reflector(c.api.lister_watcher(Node), lambda _t, node, _r: names.append(node.name),
                              key=object_name, name="nodes through the servers")
        task = asyncio.create_task(reflector.run())
        try:
            await c.wait("the reflector's list", lambda: reflector.lists == 1 and names)
            since = time.monotonic()
            await nemesis.kill_servers_in_turn(c, down=0.5)
            served_during(c, "kill-server", "start-server")
            before = len(names)
            await c.cordon("n1", True)     # a change after the last restart, seen through the watch
            await c.wait("the cordon through the watch", lambda: len(names) > before)
            await c.cordon("n1", False)
            assert reflector.lists == 1, f"the watch relisted {reflector.lists - 1} times"
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        await c.apply_model("m2", replicas=1)   # the control plane works after
        await c.wait_model_ready("m2", 1)
        c.holds(nodes_stay_ready=inv.nodes_stay_ready(c.history, since))


HEARTBEAT_TTL = 5   # s a node's heartbeat key lives in test_servers_down_two_then_all (the agents beat every 2 s)


async def _serves(c, model: str) -> bool:
    """Whether the gateway answers a completion of `model`."""
    body = {"model": model, "prompt": "hi", "max_tokens": 2}
    async with aiohttp.ClientSession() as http, http.post(f"{c.gateway_url}/v1/completions", json=body) as r:
        return r.status == 200


async def test_servers_down_two_then_all(tmp_path):
    """Issue 43's two cases of servers down, as two phases of one cluster (two nodes, three servers,
    the heartbeat key's life shortened to 5 s, node grace 3 s; docs/contracts.md gives the
    windows of the default settings), under load through the gateway:

    - two of the three down (both agents' first choice among them: each client orders the servers
      by its certificate, llmgw/client/client.py) for longer than a heartbeat key lives, and
      until model m2, applied meanwhile on every free GPU, serves through the gateway: no Node is
      written Ready=False (each agent's beats reached the live server before its key expired),
      m2's shards reached both agents and its replicas the gateway (their watches resumed on the
      live server), and a reflector of Nodes through the servers resumed there without a relist;
    - then the third down too, until every node was judged (its key expired and the node grace
      ran out: held back as MassSilence), then all three started again: nothing is evicted, and
      the reflector resumes once more without a relist.
    Throughout: no request through the gateway fails (the gateway keeps its tables), and requests
    end inside each window."""
    async with under_load(tmp_path, replicas=1, nodes=2, servers=3, heartbeat_ttl=HEARTBEAT_TTL) as c:
        names: list[str] = []
        reflector = Reflector(c.api.lister_watcher(Node), lambda _t, node, _r: names.append(node.name),
                              key=object_name, name="nodes through the servers")
        task = asyncio.create_task(reflector.run())
        nodes = [n.name for n in c.nodes]
        try:
            await c.wait("the reflector's list", lambda: reflector.lists == 1 and names)
            since = time.monotonic()
            firsts = {c.server_urls.index(_failover_order(c.server_urls, c.certs[n][0])[0]) for n in nodes}
            kept = next(i for i in range(c.servers) if i not in firsts)    # two agents: one server is neither's
            async with nemesis.servers_down(c, [i for i in range(c.servers) if i != kept]):
                await c.apply_model("m2", replicas=3)     # every GPU m leaves: a shard on each node
                await asyncio.sleep(max(0.0, since + HEARTBEAT_TTL + 2 - time.monotonic()))
                c.holds(nodes_stay_ready=inv.nodes_stay_ready(c.history, since))
                await c.wait_model_ready("m2", 3)
                await c.wait("m2 through the gateway", lambda: _serves(c, "m2"))
                all_down = time.monotonic()
                async with nemesis.servers_down(c, [kept]):
                    await c.wait("every node judged while no server runs", lambda: c.evicted_or_held(nodes))
                back = time.monotonic()
            for t0, t1 in ((since, all_down), (all_down, back)):
                assert [r for r in c.history.requests if t0 < r.end < t1], f"no request ended in {t0:.1f}..{t1:.1f}"
            await c.wait("every node Ready again", lambda: _all_ready(c, nodes))
            before = len(names)
            await c.cordon(nodes[0], True)     # a change after the servers' return, seen through the watch
            await c.wait("the cordon through the watch", lambda: len(names) > before)
            await c.cordon(nodes[0], False)
            assert reflector.lists == 1, f"the watch relisted {reflector.lists - 1} times"
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        c.holds(nodes_stay_ready=inv.nodes_stay_ready(c.history, since, all_down),
                no_eviction=inv.no_eviction(c.history, set(nodes), since))


async def _all_ready(c, nodes: list[str]) -> bool:
    return all([await c.node_condition(n, "Ready") == "True" for n in nodes])


async def test_etcd_member_kill_during_update_loses_no_request(tmp_path):
    async with under_load(tmp_path, etcd_members=3) as c:
        old = {r.name for r in await c.replicas("m")}
        await c.set_args("m", ["--tokens-per-second", "400"])
        await nemesis.kill_etcd_member(c, 0)
        served_during(c, "kill-etcd", "start-etcd")
        await c.wait_rolled("m", old, 2)


# ------------------------------------------------------------------ issue 21's cases

def by_load(replicas: list) -> list[str]:
    """Nodes hosting replicas, the busiest first."""
    count = Counter(p.node for r in replicas for p in r.spec.placement)
    return [n for n, _ in count.most_common()]


async def test_node_back_after_loss_gets_no_engine_on_held_gpus(tmp_path):
    async with with_model(tmp_path, 6) as c:      # every GPU of the cluster
        victim = by_load(await c.replicas("m"))[0]
        nemesis.stop_agent(c, victim)

        async def lost():
            """Judged lost (with every GPU taken, its replacements have nowhere to go while its
            GPUs stay booked), or its replicas already gone (released before their engines were)."""
            if await c.node_condition_reason(victim, "Evicting") == ("True", "NodeLost"):
                return True
            return not [r for r in await c.replicas("m") if victim in {p.node for p in r.spec.placement}]
        await c.wait(f"{victim} declared lost", lost)
        nemesis.cont_agent(c, victim)
        await c.settle({"m": 6})
        c.holds(**common(c, "m", 6))


@pytest.mark.parametrize("silent_nodes, node_grace, interval", [
    pytest.param(4, 12.0, 4.5, id="staggered-heal-4-of-6"),
    pytest.param(3, 3.0, 0.0, id="half-silent-3-of-6"),
])
async def test_partition_evicts_nothing(tmp_path, silent_nodes, node_grace, interval):
    """Agents of the busiest nodes stop (their engines serve on); once the controllers noticed
    (eviction held back, or done), they come back one by one, `interval` apart (longer than the
    re-check of held-back nodes, grace / 3, so a wrong judgement in between shows)."""
    async with with_model(tmp_path, 6, nodes=6, node_grace=node_grace) as c:
        busiest = by_load(await c.replicas("m"))
        silent = (busiest + [n.name for n in c.nodes if n.name not in busiest])[:silent_nodes]
        async with c.load(["m"]):
            start = time.monotonic()
            await nemesis.partition_heal(c, silent[::-1], lambda: c.evicted_or_held(silent),
                                         interval)
            await c.settle({"m": 6})
        c.holds(**common(c, "m", 6), no_eviction=inv.no_eviction(c.history, set(silent), start),
                no_failed_requests=inv.no_failed_requests(c.history))


async def test_silent_node_eviction_loses_no_request(tmp_path):
    async with with_model(tmp_path, 1) as c:     # its one replica on the node that goes silent
        victim = by_load(await c.replicas("m"))[0]
        async with c.load(["m"]):
            nemesis.stop_agent(c, victim)   # the engine serves on: a replacement can be made before the break
            await c.wait_serving("m", lambda r: victim not in {p.node for p in r.spec.placement},
                                 f"m moved off the silent {victim}")
            nemesis.cont_agent(c, victim)
            await c.settle({"m": 1})
        c.holds(**common(c, "m", 1), no_failed_requests=inv.no_failed_requests(c.history))


async def test_single_replica_crash_rebuilds_at_once(tmp_path):
    async with with_model(tmp_path, 1) as c:
        first = (await c.replicas("m"))[0]
        pid = next(s.status.pid for s in await c.shards() if s.spec.replica == first.name)
        nemesis.kill_engine(c, pid)
        await c.wait_serving("m", lambda r: r.name != first.name or r.status.restarts > first.status.restarts,
                             "m Ready again after the crash")
        await c.settle({"m": 1})
        c.holds(**common(c, "m", 1), first_rebuild_at_once=inv.first_rebuild_at_once(c.history))


async def test_restarted_server_resumes_watches(tmp_path):
    async with with_model(tmp_path, 1) as c:
        _, before = await c.api.list(Node)
        await nemesis.kill_server(c)
        await c.cordon("n1", True)
        _, now = await c.api.list(Node)
        # Nodes, which no component watches through the server: the test's watches are its
        # first. One that listed after the restart watches first (it starts the server's cache
        # of nodes); then one resumes from before the restart, as every informer does.
        await c.resume_watch("nodes", now, lambda: c.cordon("n1", False))
        await c.resume_watch("nodes", before, lambda: c.cordon("n2", True))
        await c.settle({"m": 1})
        c.holds(**common(c, "m", 1), watches_resume=inv.watches_resume(c.history))


async def test_foreign_port_is_given_to_one_shard_at_most(tmp_path):
    async with fault_cluster(tmp_path, node_plans(2)) as c:
        first = c.engine_ports()[0]
        # a foreign process listens on each node's first engine port
        with c.squatting({n.name: first for n in c.nodes}) as squatted:
            assert len(squatted) == len(c.nodes), f"only {squatted} could be held"
            await c.apply_model("m", replicas=1)

            async def ready_or_reused():
                return await c.ready("m") or inv.foreign_port_once(c.history)
            await c.wait("m Ready (or the foreign port given twice)", ready_or_reused)
            seen = {(a, p) for sample in c.history.samples for a, p, _ in sample.foreign}
            assert squatted <= seen, f"the recorder missed the foreign listeners {sorted(squatted - seen)}"
            if not inv.foreign_port_once(c.history):
                await c.settle({"m": 1})
            c.holds(**common(c, "m", 1), foreign_port_once=inv.foreign_port_once(c.history))


# ------------------------------------------------------------------ issue 44: backup and restore

async def _key(c, name: str) -> str:
    """A new ApiKey for every model; its secret."""
    secret = new_secret(name)
    await c.api.create(build_key(name, secret, owner="drill", models=(), selector=(), expires=None, rpm=None,
                                 tpm=None, concurrency=None, priority="standard"))
    return secret


async def _answered(c, secret: str, status: int) -> bool:
    """Whether the gateway answers a completion of kept with this key `status`."""
    body = {"model": "kept", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    async with aiohttp.ClientSession() as http, http.post(
            f"{c.gateway_url}/v1/chat/completions", json=body, headers={"Authorization": f"Bearer {secret}"}) as r:
        return r.status == status


async def test_etcd_lost_and_restored_under_load_keeps_engines_and_requests(tmp_path):
    """Issue 44's drill on a 3-member etcd, two nodes of one GPU (a Model a node): a snapshot, then
    Model `deleted` deleted and `created` created on the GPU it freed, an API key made; then every
    etcd member SIGKILLed, its data deleted and the cluster restored from the snapshot, with the
    server, the controller-managers, the agents, the gateway and the engines left running (the
    README's runbook). Requests to `kept` with a key of the snapshot never fail, its engine keeps its
    pid, `created`'s engine is stopped and `deleted`'s started again in its place, no GPU or port is
    held twice, and the key made after the snapshot is refused again."""
    async with fault_cluster(tmp_path, nodes=2, gpus=1, etcd_members=3, gateway_args=["--watch-api-keys"]) as c:
        for name in ("kept", "deleted"):
            await c.apply_model(name, replicas=1)
            await c.wait_model_ready(name, 1)
        secret = await _key(c, "at-snapshot")
        await c.wait("the key known to the gateway", lambda: _answered(c, secret, 200))
        async with c.load(["kept"], key=secret):
            at_snapshot = {s.name: s.status.pid for s in await c.shards()}
            snapshot = tmp_path / "fleet.snap"
            await save(snapshot, *c.etcd_flags("dev-admin"))
            saved = time.monotonic()
            await c.api.delete(Model, "deleted")
            deleted = {pid for name, pid in at_snapshot.items() if name.startswith("deleted-")}
            await c.wait("deleted's engine gone", lambda: not deleted & {e.pid for e in c.engine_processes()})
            await c.apply_model("created", replicas=1)
            await c.wait_model_ready("created", 1)
            created = {s.status.pid for s in await c.shards() if s.name.startswith("created-")}
            later = await _key(c, "after-snapshot")
            await c.wait("the later key known to the gateway", lambda: _answered(c, later, 200))

            await nemesis.lose_etcd_and_restore(c, snapshot)

            async def rebuilt() -> bool:     # (its status in the snapshot says Ready, with the old pid)
                pids = {s.status.pid for s in await c.shards() if s.name.startswith("deleted-")}
                return bool(pids) and not pids & deleted and pids <= {e.pid for e in c.engine_processes()}
            await c.wait("deleted's engine started again", rebuilt)
            await c.settle({"kept": 1, "deleted": 1})          # and created's engine gone with its Shard
            await c.wait("the later key refused again", lambda: _answered(c, later, 401))
            assert sorted(m.name for m in (await c.store.list(Model))[0]) == ["deleted", "kept"]
            assert [k.name for k in (await c.store.list(ApiKey))[0]] == ["at-snapshot"]
        kept = {pid for name, pid in at_snapshot.items() if name.startswith("kept-")}
        restarted = [f"t={s.t:.1f}: kept's engine {sorted(kept)} not running" for s in c.history.samples
                     if s.t > saved and not kept <= {e.pid for e in s.engines}]
        running = created & {e.pid for e in c.engine_processes()}
        c.holds(no_failed_requests=inv.no_failed_requests(c.history),
                exclusive_engines=inv.exclusive_engines(c.history), converged=inv.converged(c.history),
                engines_kept=restarted[:3], created_stopped=[f"created's engine {running} runs"] if running else [])

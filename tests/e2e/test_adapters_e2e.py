"""LoRA adapters end to end (issue 47): etcd, server, controller-manager, gateway and an agent as
processes, running sim engines that serve vLLM's runtime LoRA API.

An Adapter becomes resident on minReplicas replicas and is served under its name through the
gateway; a cold adapter is loaded once for a burst of requests, which wait for it: the gateway asks
the agent directly (the controller-manager stopped, nobody places it), the agent keeps it through
its syncs, and the controller adopts it when it is back; where the agent cannot be reached, the
controller's placement loads it; the agent takes a direct load from a gateway alone; a bad source
fails the Adapter with the engine's reason; an engine killed and rebuilt has its adapter loaded
again before its replica serves, and the Adapter's status never says it is resident where the
engine does not list it; a pulled adapter comes through the weights cache, pinned by its digest,
and new weights are loaded again; with its origin down, one whose digest the cache holds loads from it.
"""
from __future__ import annotations

import asyncio
import json
import os
import signal
import ssl
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

import aiohttp
import pytest

from llmgw.api import ADAPTER_READY, LoraAdapter, Model, Node, Replica, Shard, get_condition
from llmgw.client import Client, ClientConfig
from llmgw.dev.cluster import FAKES, LocalCluster, NodePlan
from llmgw.dev.process import free_port
from tests.fixtures.gateway import metric
from tests.fixtures.poll import until
from tests.fixtures.weights_origin import content_digest, generated, origin  # noqa: F401 - origin is a fixture

pytestmark = pytest.mark.timeout(300)
BASE = "base"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """One node, whose SGLang is the fake (hack/fakes/sglang-python); requests for an adapter resident
    nowhere wait up to a minute at the gateway."""
    root = tmp_path_factory.mktemp("adapters")
    sglang = root / "sglang-python"
    sglang.write_text(f"#!/bin/sh\nexec {sys.executable} {FAKES / 'sglang-python'} \"$@\"\n")
    sglang.chmod(0o755)
    c = LocalCluster(root, [NodePlan("node01", "ib-a")], gateway_port=free_port(),
                     drain_delay=0.5, gateway_args=["--queue-timeout", "60"], engines={"sglang": str(sglang)})
    try:
        yield c.start()
    finally:
        c.stop()


@pytest.fixture(scope="module")
def weights(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("lora")
    for name in ("sql", "chat"):
        (root / name).mkdir()
        (root / name / "adapter_config.json").write_text("{}")
    return root


@pytest.fixture
async def client(cluster):
    async with Client.from_config(ClientConfig.load(cluster.admin_config)) as c:
        if not await _exists(c, Model, BASE):   # two replicas, two adapter slots each
            await c.create(Model.model_validate({"metadata": {"name": BASE}, "spec": {
                "replicas": 2, "adapters": {"maxLoaded": 2},
                "profiles": [{"engine": "sim", "args": ["--lora-load-seconds", "0.3"]}]}}))
        await until(lambda: _ready_replicas(c), "2 Ready replicas of the base", timeout=120, interval=0.2)
        yield c


async def _exists(c: Client, kind, name: str) -> bool:
    return any(o.name == name for o in (await c.list(kind))[0])


async def _ready_replicas(c: Client) -> list[Replica]:
    replicas = [r for r in (await c.list(Replica))[0] if r.spec.model == BASE and r.status.phase == "Ready"]
    return replicas if len(replicas) == 2 else []


def adapter(name: str, source: str, min_replicas: int) -> LoraAdapter:
    return LoraAdapter.model_validate({"metadata": {"name": name}, "spec": {
        "baseModel": BASE, "source": source, "minReplicas": min_replicas}})


async def status(c: Client, name: str, reason: str) -> LoraAdapter | None:
    a = await c.get(LoraAdapter, name)
    ready = get_condition(a.status.conditions, ADAPTER_READY)
    return a if ready is not None and ready.reason == reason else None


async def engine_lists(c: Client, replica: str, name: str) -> bool:
    """Whether the replica's engine itself lists the adapter (GET /v1/models)."""
    r = await c.get(Replica, replica)
    async with aiohttp.ClientSession() as http, http.get(f"http://{r.status.endpoint}/v1/models") as resp:
        return resp.status == 200 and name in {m["id"] for m in (await resp.json())["data"]}


async def complete(http: aiohttp.ClientSession, cluster, model: str) -> tuple[int, dict]:
    async with http.post(cluster.gateway_url + "/v1/completions",
                         json={"model": model, "prompt": "hello", "max_tokens": 2}) as resp:
        return resp.status, await resp.json()


def cli(cluster, *args: str) -> str:
    out = subprocess.run([sys.executable, "-m", "llmgw.cli.main", *args], capture_output=True, text=True,
                         env={**os.environ, "LLMGW_CONFIG": str(cluster.admin_config)}, timeout=60)
    assert out.returncode == 0, out.stderr
    return out.stdout


def loads(cluster, name: str) -> int:
    """Loads of the adapter over every engine log of the node (the sim logs each as vLLM does)."""
    return sum(log.read_text(errors="replace").count(f"Loaded new LoRA adapter: name '{name}'")
               for log in (cluster.dir / "nodes").rglob("*.log"))


async def test_an_adapter_is_resident_on_min_replicas_and_served_under_its_name(cluster, client, weights):
    await client.create(adapter("sql", str(weights / "sql"), 1))
    sql = await until(lambda: status(client, "sql", "Resident"), "sql resident", timeout=60, interval=0.2)
    assert len(sql.status.resident) == 1 and sql.status.placement == sql.status.resident
    [here] = sql.status.resident
    [other] = [r.name for r in await _ready_replicas(client) if r.name != here]
    assert await engine_lists(client, here, "sql") and not await engine_lists(client, other, "sql")

    async with aiohttp.ClientSession() as http:
        code, body = await complete(http, cluster, "sql")
        assert (code, body["model"]) == (200, "sql")
        async with http.get(cluster.gateway_url + "/v1/models") as resp:
            cards = {m["id"]: m.get("parent") for m in (await resp.json())["data"]}
    assert cards[BASE] is None and cards["sql"] == BASE

    row = next(line.split() for line in cli(cluster, "get", "adapters").splitlines() if line.startswith("sql"))
    assert row[:5] == ["sql", BASE, "1/1", "Resident", here]
    placement = cli(cluster, "describe", "adapter", "sql").split("Placement:\n")[1].splitlines()
    assert placement[1].split() == [here, "yes", "<none>", "<none>"]


async def test_an_adapter_whose_agent_cannot_be_reached_is_loaded_by_the_controllers_placement(
        cluster, client, weights):
    """The gateway's first direct load (it reads the agent's address once) finds the Node's agentEndpoint
    pointing nowhere: the controller places the adapter, as the demand report asks, and its agent loads it."""
    (weights / "far").mkdir()
    await client.create(adapter("far", str(weights / "far"), 0))
    await until(lambda: _known_to_gateway(cluster, "far"), "the gateway to know far", timeout=30)
    node = await client.get(Node, "node01")
    endpoint = node.status.agentEndpoint
    await client.patch_status(Node, "node01", {"agentEndpoint": f"https://127.0.0.1:{free_port()}"})
    try:
        async with aiohttp.ClientSession() as http:
            answers = await asyncio.gather(*(complete(http, cluster, "far") for _ in range(5)))
    finally:
        await client.patch_status(Node, "node01", {"agentEndpoint": endpoint})
    assert {(code, body.get("model")) for code, body in answers} == {(200, "far")}
    assert loads(cluster, "far") == 1
    far = await client.get(LoraAdapter, "far")
    assert len(far.status.resident) == 1 and far.status.placement == far.status.resident
    assert "direct load of adapter far" in cluster.log("gateway").read_text()
    await client.delete(LoraAdapter, "far")    # its slot for the adapters of the tests below


async def test_a_burst_for_a_cold_adapter_waits_for_one_direct_load_which_the_controller_adopts(
        cluster, client, weights):
    await client.create(adapter("chat", str(weights / "chat"), 0))
    await until(lambda: status(client, "chat", "OnDemand"), "chat known, resident nowhere", timeout=30)
    await until(lambda: _known_to_gateway(cluster, "chat"), "the gateway to know chat", timeout=30)
    cluster.stop_processes(["controller-manager"])     # no placement but the gateway's direct load
    try:
        async with aiohttp.ClientSession() as http:
            answers = await asyncio.gather(*(complete(http, cluster, "chat") for _ in range(50)))
        assert {(code, body.get("model")) for code, body in answers} == {(200, "chat")}
        assert loads(cluster, "chat") == 1
        chat = await client.get(LoraAdapter, "chat")
        assert chat.status.placement == [] and chat.status.resident == []
        [here] = [r.name for r in await _ready_replicas(client) if await engine_lists(client, r.name, "chat")]
        await asyncio.sleep(2.5)    # the agent syncs its engine every second (its probe interval): chat stays
        assert await engine_lists(client, here, "chat")
    finally:
        cluster.start_controller_manager()
    chat = await until(lambda: status(client, "chat", "Resident"), "chat adopted by the controller", timeout=60)
    assert chat.status.placement == chat.status.resident == [here]
    assert loads(cluster, "chat") == 1
    async with aiohttp.ClientSession() as http:
        async with http.get(cluster.gateway_url + "/metrics") as resp:
            assert metric(await resp.text(), "llmgw_gateway_requests_total", model="chat", code="200") == 50
        async with http.get(f"http://127.0.0.1:{cluster.metrics_ports['agent-node01']}/metrics") as resp:
            agent = await resp.text()
    assert metric(agent, "llmgw_agent_adapter_loads_total", model=BASE, result="loaded") >= 2   # sql and chat
    assert metric(agent, "llmgw_agent_adapter_load_seconds_count", model=BASE) >= 2


async def test_an_agent_takes_a_direct_load_from_a_gateway_alone(cluster, client):
    endpoint = (await client.get(Node, "node01")).status.agentEndpoint
    [replica] = [r.name for r in await _ready_replicas(client)][:1]
    url = f"{endpoint}/adapters/chat/load"
    for who in ("controller-manager", "dev-admin", "node01"):
        code, text = await asyncio.to_thread(_post, url, cluster.ca_cert, cluster.certs[who], {"replica": replica})
        assert code == 403 and "only a gateway (CN=gateway O=llmgw:components)" in text, (who, code, text)
    code, text = await asyncio.to_thread(_post, url, cluster.ca_cert, cluster.certs["gateway"], {"replica": "no-such"})
    assert code == 404 and "replica no-such has no serving shard on this node" in text


def _post(url: str, ca: str, identity: tuple[str, str], body: dict) -> tuple[int, str]:
    ctx = ssl.create_default_context(cafile=ca)
    ctx.check_hostname = False
    ctx.load_cert_chain(*identity)
    request = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST",
                                     headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, context=ctx, timeout=30) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode()


async def _known_to_gateway(cluster, name: str) -> bool:
    """The gateway's 404 for an unknown name lists the names it knows."""
    async with aiohttp.ClientSession() as http:
        async with http.post(cluster.gateway_url + "/v1/completions", json={"model": "no-such-model"}) as resp:
            return name in await resp.text()


async def test_a_bad_source_fails_the_adapter_with_the_engines_reason(cluster, client, weights):
    await client.create(adapter("broken", str(weights / "missing"), 1))
    broken = await until(lambda: status(client, "broken", "LoadFailed"), "broken LoadFailed", timeout=60)
    [pending] = broken.status.pending
    assert pending.reason == "LoadFailed" and "No adapter found" in pending.message
    assert broken.status.resident == []
    events = await client.events(LoraAdapter, "broken")
    assert any(e["reason"] == "LoadFailed" and e["type"] == "Warning" for e in events)
    await client.delete(LoraAdapter, "broken")


async def test_an_engine_restart_loads_it_again_and_the_status_never_lies(cluster, client):
    sql = await client.get(LoraAdapter, "sql")
    [victim] = sql.status.resident
    [shard] = [s for s in (await client.list(Shard, node="node01"))[0] if s.spec.replica == victim]
    os.kill(shard.status.pid, signal.SIGKILL)

    async def moved_on() -> bool:    # the controller has seen the engine go
        return victim not in (await client.get(LoraAdapter, "sql")).status.resident
    await until(moved_on, "sql no longer resident on the killed engine's replica", timeout=30)

    checked = 0

    async def back() -> bool:        # every claim of residency on the way is the engine's own
        nonlocal checked
        a = await client.get(LoraAdapter, "sql")
        for replica in a.status.resident:
            # An agent unloads an adapter only once the status no longer names its replica, so an
            # engine that does not list it after the status was read is a lie only if the status
            # still names the replica when read again (an eviction in between is not).
            assert await engine_lists(client, replica, "sql") or \
                replica not in (await client.get(LoraAdapter, "sql")).status.resident, \
                f"status: resident on {replica}; its engine disagrees"
            checked += 1
        return victim in a.status.resident
    await until(back, "sql resident again on the rebuilt replica", timeout=120, interval=0.1)
    assert checked
    rebuilt = await client.get(Replica, victim)
    assert rebuilt.status.restarts == 1 and await engine_lists(client, victim, "sql")
    async with aiohttp.ClientSession() as http:
        assert (await complete(http, cluster, "sql"))[0] == 200


async def engine_root(c: Client, replica: str, name: str) -> str | None:
    """Where the replica's engine loaded the adapter from (its /v1/models card's root)."""
    r = await c.get(Replica, replica)
    async with aiohttp.ClientSession() as http, http.get(f"http://{r.status.endpoint}/v1/models") as resp:
        return next((m["root"] for m in (await resp.json())["data"] if m["id"] == name), None)


async def test_a_pulled_adapter_comes_through_the_weights_cache_and_new_weights_are_loaded_again(
        cluster, client, origin):
    v1, v2 = generated(1, {"adapter_config.json": 40, "adapter_model.safetensors": 3000}), \
        generated(2, {"adapter_config.json": 40, "adapter_model.safetensors": 3000})
    url1, url2 = origin.add_dir("tone-v1", v1), origin.add_dir("tone-v2", v2)
    tone = adapter("tone", url1, 1)
    tone.spec.digest = content_digest(v1)
    await client.create(tone)
    tone = await until(lambda: status(client, "tone", "Resident"), "tone resident", timeout=60, interval=0.2)
    [here] = tone.status.resident
    root = Path(await engine_root(client, here, "tone"))
    assert {p.name: p.read_bytes() for p in root.iterdir()} == v1, "the engine reads the cache's copy"
    assert cluster.dir in root.parents

    tone.spec.source, tone.spec.digest = url2, content_digest(v2)
    await client.update(tone)

    async def reloaded() -> Path | None:
        now = await engine_root(client, here, "tone")
        return Path(now) if now is not None and Path(now) != root else None
    root2 = await until(reloaded, "tone loaded again from its new weights", timeout=60, interval=0.2)
    assert {p.name: p.read_bytes() for p in root2.iterdir()} == v2
    assert loads(cluster, "tone") == 2
    await until(lambda: status(client, "tone", "Resident"), "tone resident with its new digest", timeout=30)

    wrong = adapter("wrong", url1, 1)
    wrong.spec.digest = content_digest(generated(3, {"adapter_config.json": 40}))   # not what the origin serves
    await client.create(wrong)
    wrong = await until(lambda: status(client, "wrong", "LoadFailed"), "wrong LoadFailed", timeout=60)
    assert "DigestMismatch" in wrong.status.pending[0].message
    await client.delete(LoraAdapter, "wrong")     # its slot for the next

    # The origin down: an adapter pinned by a digest the cache holds is loaded from the cache.
    await origin.stop()
    again = adapter("tone-again", url1, 1)
    again.spec.digest = content_digest(v1)
    await client.create(again)
    again = await until(lambda: status(client, "tone-again", "Resident"), "tone-again resident from the cache",
                        timeout=60, interval=0.2)
    assert Path(await engine_root(client, again.status.resident[0], "tone-again")) == root
    assert await status(client, "tone", "Resident"), "tone still resident after its engine's syncs"
    for name in ("tone", "tone-again"):
        await client.delete(LoraAdapter, name)


async def test_a_requested_adapter_evicts_the_least_recently_requested_where_no_slot_is_free(
        cluster, client, weights):
    await client.create(Model.model_validate({"metadata": {"name": "small"}, "spec": {
        "replicas": 1, "adapters": {"maxLoaded": 1}, "profiles": [{"engine": "sim"}]}}))
    for name in ("e1", "e2"):
        (weights / name).mkdir()
        await client.create(LoraAdapter.model_validate({"metadata": {"name": name}, "spec": {
            "baseModel": "small", "source": str(weights / name), "minReplicas": 0}}))

    async def small_ready() -> Replica | None:
        return next((r for r in (await client.list(Replica))[0]
                     if r.spec.model == "small" and r.status.phase == "Ready"), None)
    replica = await until(small_ready, "small's replica Ready", timeout=60, interval=0.2)
    await until(lambda: _known_to_gateway(cluster, "e2"), "the gateway to know e2", timeout=30)
    async with aiohttp.ClientSession() as http:
        assert (await complete(http, cluster, "e1"))[0] == 200
        assert await engine_lists(client, replica.name, "e1")
        await until(lambda: status(client, "e1", "Resident"), "e1 placed and resident", timeout=30)
        code, body = await complete(http, cluster, "e2")     # its one slot is e1's: e1 goes
    assert (code, body["model"]) == (200, "e2")
    assert await engine_lists(client, replica.name, "e2") and not await engine_lists(client, replica.name, "e1")

    async def dropped() -> LoraAdapter | None:    # the agent reports e1 Evicted: the controller drops it
        e1 = await client.get(LoraAdapter, "e1")
        return e1 if e1.status.placement == [] else None
    e1 = await until(dropped, "e1 out of its placement", timeout=30)
    assert e1.status.resident == []
    assert any(e["reason"] == "Evicted" for e in await client.events(LoraAdapter, "e1"))
    e2 = await until(lambda: status(client, "e2", "Resident"), "e2 adopted", timeout=30)
    assert e2.status.placement == [replica.name]


async def test_an_adapter_of_an_sglang_model_loads_through_sglangs_api_and_answers(cluster, client, weights):
    """An SGLang Model, its engine the fake SGLang (the sim playing SGLang, started by SGLang's renderer's
    command line): its Adapter is loaded with SGLang's /load_lora_adapter and answers through the gateway
    under its name, which the gateway sends as BASE:ADAPTER."""
    source = weights / "sgl-base"
    source.mkdir()
    (weights / "sgl-sql").mkdir()
    (weights / "sgl-sql" / "adapter_config.json").write_text("{}")   # SGLang reads it at a load
    await client.create(Model.model_validate({"metadata": {"name": "sgl"}, "spec": {
        "source": str(source), "replicas": 1, "adapters": {"maxLoaded": 1}, "profiles": [{"engine": "sglang"}]}}))
    await client.create(LoraAdapter.model_validate({"metadata": {"name": "sgl-sql"}, "spec": {
        "baseModel": "sgl", "source": str(weights / "sgl-sql"), "minReplicas": 1}}))
    sql = await until(lambda: status(client, "sgl-sql", "Resident"), "sgl-sql resident", timeout=90, interval=0.2)
    [here] = sql.status.resident
    assert (await client.get(Replica, here)).spec.profile.engine == "sglang"
    assert await engine_lists(client, here, "sgl-sql")
    async with aiohttp.ClientSession() as http:
        code, body = await complete(http, cluster, "sgl-sql")
    assert (code, body["model"]) == (200, "sgl:sgl-sql"), body
    logs = "".join(log.read_text(errors="replace") for log in (cluster.dir / "nodes").rglob("*.log"))
    assert logs.count("LoRA adapter loading completes: name 'sgl-sql'") == 1
    await client.delete(LoraAdapter, "sgl-sql")
    await client.delete(Model, "sgl")

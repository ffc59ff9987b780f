"""`llmgw gateway --server`: the routing table follows a real server's watch, across a restart."""
from __future__ import annotations

import subprocess

import aiohttp
import pytest

from llmgw.api import Model, Replica
from llmgw.dev.process import free_port
from llmgw.gateway.proxy import REPLICA_HEADER
from llmgw.store import Compactor, Store
from tests.fixtures.cluster import api_server, ca_dir  # noqa: F401
from tests.fixtures.gateway import CLI, Sim, metric
from tests.fixtures.poll import until

pytestmark = pytest.mark.timeout(180)


def new_model() -> Model:
    return Model.model_validate({"metadata": {"name": "llama"},
                                 "spec": {"aliases": ["small"], "profiles": [{"engine": "sim"}]}})


def new_replica(name: str, finalizers: list[str] = ()) -> Replica:
    return Replica.model_validate({
        "metadata": {"name": name, "finalizers": list(finalizers)},
        "spec": {"model": "llama", "templateHash": "t1", "profile": {"engine": "sim"},
                 "servedModelNames": ["llama", "small"]},
    })


async def make_ready(client, name: str, endpoint: str, finalizers=()) -> None:
    obj = await client.create(new_replica(name, finalizers))
    obj.status.phase, obj.status.endpoint = "Ready", endpoint
    await client.update_status(obj)


async def test_table_follows_the_server_watch_and_a_restart(api_server, etcd, tmp_path):
    sims = {n: Sim.start("llama", "small", wait=False) for n in ("a", "b", "c")}
    cert, key = api_server.issue_component("gateway")
    port = free_port()
    log = open(tmp_path / "gateway.log", "wb")
    gw = subprocess.Popen(
        [*CLI, "gateway", "--listen", f"127.0.0.1:{port}", "--server", api_server.url,
         "--ca", api_server.ca, "--cert", cert, "--key", key],
        stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        for s in sims.values():
            s.wait_ready()
        async with api_server.client() as admin, aiohttp.ClientSession() as http:
            async def get(path):
                try:
                    async with http.get(url + path) as r:
                        return r.status, await r.text()
                except aiohttp.ClientConnectionError:
                    return 0, ""

            async def routable():
                status, text = await get("/metrics")
                return metric(text, "llmgw_gateway_routable_replicas", model="llama") if status == 200 else -1

            async def ask(name="small"):
                async with http.post(url + "/v1/completions",
                                     json={"model": name, "prompt": "x", "max_tokens": 1}) as r:
                    await r.read()
                    return r.status, r.headers.get(REPLICA_HEADER)

            await until(lambda: _is(get("/healthz"), 200), "the gateway listed models and replicas")
            await admin.create(new_model())
            await make_ready(admin, "r-a", sims["a"].endpoint, finalizers=["test.llmgw.io/hold"])
            await make_ready(admin, "r-b", sims["b"].endpoint)
            await until(lambda: _eq(routable(), 2), "both replicas routable")
            assert {(await ask())[1] for _ in range(4)} == {"r-a", "r-b"}

            # Marked for deletion (a finalizer holds the object): out of the table at once.
            deleted = await admin.delete(Replica, "r-a")
            assert deleted.metadata.deletionTimestamp is not None
            await until(lambda: _eq(routable(), 1), "r-a left the table")
            assert [await ask("llama") for _ in range(4)] == [(200, "r-b")] * 4

            await make_ready(admin, "r-c", sims["c"].endpoint)
            await until(lambda: _eq(routable(), 2), "r-c routable")

            # The server goes down; meanwhile r-c is deleted and its engine dies, and etcd's
            # history is compacted past the deletion (a later write, then compaction to the
            # head), so the gateway cannot replay the DELETED: it must relist and diff.
            api_server.stop()
            async with Store(etcd.endpoint) as store:
                await store.delete(Replica, "r-c")
                await store.create(new_replica("r-later"))
                await Compactor(store.etcd, keep=0).compact()
            sims["c"].kill()
            assert await routable() == 2  # the stale view stays in service while the server is away
            api_server.restart()
            await until(lambda: _eq(routable(), 1), "r-c gone after the relist")
            _, text = await get("/metrics")
            assert metric(text, "llmgw_gateway_inflight_requests", replica="r-c") == 0
            assert 'replica="r-c"' not in text
            assert [await ask() for _ in range(4)] == [(200, "r-b")] * 4
            _, text = await get("/metrics")
            assert metric(text, "llmgw_gateway_upstream_errors_total") == 0
    finally:
        gw.terminate()
        assert gw.wait(15) == 0, (tmp_path / "gateway.log").read_text()[-3000:]
        for s in sims.values():
            s.stop()
        log.close()
    assert "routing: replica r-c deleted" in (tmp_path / "gateway.log").read_text()


async def _is(coro, status):
    return (await coro)[0] == status


async def _eq(coro, value):
    return (await coro) == value

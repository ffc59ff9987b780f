"""Will it fit, end to end against a real etcd: the model controller estimates a path-sourced
Model's GPU memory from its files into the Model's status and its replicas, the scheduler refuses
GPUs with less free and names the bytes, places on the node that fits and gives the replica its KV
budget, which the replica controller hands its shard and the engine's command carries."""
from __future__ import annotations

from pathlib import Path

import pytest

from controllers.model import ModelController
from controllers.replica import ReplicaController
from controllers.scheduler import SchedulerController
from llmgw.api import Model, Replica, Shard, get_condition
from llmgw.api.wellknown import MODEL_LABEL
from llmgw.engines import NodeFacts, render
from llmgw.printers.kinds.model import ModelPrinter
from tests.fixtures.ctrlkit import node, running
from tests.fixtures.poll import until
from tests.fixtures.tiny_safetensors import tiny_llama
from tests.fixtures.weights_origin import WeightsOrigin, origin  # noqa: F401 the fixture

MiB, GiB = 1 << 20, 1 << 30
WEIGHTS = 8_130_560      # tiny_llama's tensors: 2 MiB + 4 MiB of embeddings and head, 4 x 449 KiB of layers
KV_PER_TOKEN = 1024      # 2 (K, V) x 4 layers x 2 KV heads x 32 head size x 2 bytes (bfloat16)


def model(name: str, source: str, args: list[str] | None = None) -> Model:
    return Model.model_validate({"metadata": {"name": name}, "spec": {
        "source": source, "profiles": [{"engine": "vllm", "gpusPerNode": 1, "args": args or []}]}})


async def _replica(store, name: str) -> Replica | None:
    reps, _ = await store.list(Replica, {MODEL_LABEL: name})
    return reps[0] if reps else None


async def _placed(store, name: str) -> Replica | None:
    r = await _replica(store, name)
    return r if r and r.spec.placement else None


async def test_a_model_too_large_waits_with_the_bytes_then_places_where_it_fits_and_its_engine_is_told(
        store, tmp_path: Path):
    tiny_llama(tmp_path / "tiny")
    # vLLM's overhead, 2 GiB, + 7.8 MiB of weights + 1 KiB/token x 4096 tokens: more than 1.5 GiB
    await store.create(node("small", gpus=2, memory_mib=1536, engines=("vllm",)))
    await store.create(model("tiny", str(tmp_path / "tiny")))
    async with running(store, [ModelController(), SchedulerController(), ReplicaController()]) as m:
        rep = await until(lambda: _replica(store, "tiny"))
        assert rep.spec.memory is not None
        assert (rep.spec.memory.tp, rep.spec.memory.pp, rep.spec.memory.weightsBytes,
                rep.spec.memory.kvBytesPerToken, rep.spec.memory.overheadBytes, rep.spec.memory.minContext) \
            == (1, 1, WEIGHTS, KV_PER_TOKEN, 2 * GiB, 4096)
        assert rep.spec.memory.neededBytes == WEIGHTS + 2 * GiB + KV_PER_TOKEN * 4096
        (created,) = await until(lambda: m.events.find(reason="ReplicaCreated"))
        assert "needs 2.0 GiB per GPU at tp=1 pp=1: weights 0.0 GiB, overhead 2.0 GiB, KV 1024 B/token" \
            in created.message

        async def waiting():
            r = await _replica(store, "tiny")
            c = get_condition(r.status.conditions, "Scheduled") if r else None
            return c if c is not None and c.status == "False" else None
        cond = await until(waiting)
        assert cond.reason == "InsufficientGPUMemory"
        assert cond.message == ("0/1 nodes: 1 insufficient GPU memory; needs 2.0 GiB per GPU at tp=1, largest free "
                                "1.5 GiB (weights 0.0 GiB, overhead 2.0 GiB, KV 0.0 GiB for 4096 tokens)")

        # the Model's status: the estimate, and the condition saying there is one
        async def estimated():
            got = await store.get(Model, "tiny")
            return got if got.status.fit else None
        status = (await until(estimated)).status
        (fit,) = status.fit
        assert fit.estimate == rep.spec.memory and fit.contextTokens is None
        ok = get_condition(status.conditions, "MemoryEstimated")
        assert ok is not None and (ok.status, ok.reason) == ("True", "Estimated")
        assert ModelPrinter().wide(await store.get(Model, "tiny"))[-1] == "2.0Gi"   # get models -o wide: GPU-MEM

        big = node("big", gpus=2, memory_mib=81559, engines=("vllm",))
        big.status.addresses = ["10.0.0.1"]   # the replica controller starts rank 0 at its address
        await store.create(big)
        rep = await until(lambda: _placed(store, "tiny"))
        assert [p.node for p in rep.spec.placement] == ["big"]
        kv = 81559 * MiB - WEIGHTS - 2 * GiB
        assert rep.spec.kvCache is not None
        assert (rep.spec.kvCache.gpuMiB, rep.spec.kvCache.freeMiB, rep.spec.kvCache.bytes, rep.spec.kvCache.tokens) \
            == (81559, 81559, kv, kv // KV_PER_TOKEN)

        # the shard carries it, and vLLM's command line says it
        shard = await until(lambda: _shard(store))
        assert shard.spec.kvCache == rep.spec.kvCache
        argv = render(shard, NodeFacts("10.0.0.1"), {}).commands[0].argv
        assert argv[argv.index("--gpu-memory-utilization") + 1] == "0.900"

        async def context():
            got = await store.get(Model, "tiny")
            return got.status.fit[0].contextTokens
        assert await until(context) == kv // KV_PER_TOKEN


async def _shard(store) -> Shard | None:
    shards, _ = await store.list(Shard)
    return shards[0] if shards else None


async def test_the_floor_picks_the_node_a_hub_source_is_read_before_any_pull_and_none_is_placed_by_count(
        store, tmp_path: Path, origin: WeightsOrigin, monkeypatch: pytest.MonkeyPatch):
    tiny_llama(tmp_path / "tiny")
    origin.add_repo("org/tiny", {p.name: p.read_bytes() for p in (tmp_path / "tiny").iterdir()})
    monkeypatch.setenv("HF_ENDPOINT", origin.url)
    # 2 GiB of KV for 2 Mi tokens: 4.01 GiB in all, more than b's 4 GiB, less than c's 8
    for name, mib in (("a", 1536), ("b", 4096), ("c", 8192), ("d", 8192)):
        await store.create(node(name, gpus=1, memory_mib=mib, engines=("vllm",)))
    await store.create(model("long", str(tmp_path / "tiny"), args=["--max-model-len", "2097152"]))
    await store.create(model("hub", "hf://org/tiny", args=["--max-model-len", "2097152"]))
    await store.create(model("elsewhere", str(tmp_path / "not-here")))
    async with running(store, [ModelController(), SchedulerController()]):
        rep = await until(lambda: _placed(store, "long"))
        assert rep.spec.memory is not None and rep.spec.memory.minContext == 2097152
        hub = await until(lambda: _placed(store, "hub"))
        assert hub.spec.memory == rep.spec.memory     # the same files, read by Range reads of their heads
        assert {p.node for r in (rep, hub) for p in r.spec.placement} == {"c", "d"}
        assert all(r.range for r in origin.requests(suffix=".safetensors"))

        other = await until(lambda: _placed(store, "elsewhere"))
        assert other.spec.memory is None and other.spec.kvCache is None
        assert [p.node for p in other.spec.placement] in (["a"], ["b"])   # by count: where there is room

        async def not_estimated():
            got = await store.get(Model, "elsewhere")
            return get_condition(got.status.conditions, "MemoryEstimated")
        cond = await until(not_estimated)
        assert (cond.status, cond.reason) == ("False", "NotEstimated")
        assert ModelPrinter().wide(await store.get(Model, "elsewhere"))[-1] == "?"
        assert cond.message == (f"profile 0: no estimate, placed by GPU count: {tmp_path / 'not-here'} is not "
                                "a directory or file the controller-manager sees")

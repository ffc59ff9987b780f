"""Will it fit, end to end against a real etcd: the model controller estimates a path-sourced
Model's GPU memory from its files, the scheduler refuses GPUs with less free and says why."""
from __future__ import annotations

from pathlib import Path

from controllers.model import ModelController
from controllers.scheduler import SchedulerController
from llmgw.api import Model, Replica, get_condition
from llmgw.api.wellknown import MODEL_LABEL
from tests.fixtures.ctrlkit import node, running
from tests.fixtures.poll import until
from tests.fixtures.tiny_safetensors import tiny_llama


async def _replica(store) -> Replica | None:
    reps, _ = await store.list(Replica, {MODEL_LABEL: "tiny"})
    return reps[0] if reps else None


async def test_a_model_too_large_for_the_gpus_waits_with_the_figures_and_places_where_it_fits(store, tmp_path: Path):
    tiny_llama(tmp_path / "tiny")
    # sim engine: the default overhead, 2 GiB, + 7.8 MiB of weights + 1 KiB/token x 4096 tokens
    await store.create(node("small", gpus=2, memory_mib=1536))
    await store.create(Model.model_validate({"metadata": {"name": "tiny"}, "spec": {
        "source": str(tmp_path / "tiny"), "profiles": [{"engine": "sim", "gpusPerNode": 1}]}}))
    async with running(store, [ModelController(), SchedulerController()]) as m:
        rep = await until(lambda: _replica(store))
        assert rep.spec.gpuMemoryMiB == 2048 + 8 + 4
        (created,) = await until(lambda: m.events.find(reason="ReplicaCreated"))
        assert "needs 2.0 GiB per GPU at tp=1 pp=1: weights 0.0 GiB, overhead 2.0 GiB, KV 1024 B/token" \
            in created.message

        async def waiting():
            r = await _replica(store)
            c = get_condition(r.status.conditions, "Scheduled") if r else None
            return c if c is not None and c.status == "False" else None
        cond = await until(waiting)
        assert cond.reason == "InsufficientGPUMemory"
        assert cond.message == ("0/1 nodes: 1 insufficient GPU memory; needs 2.0 GiB free per GPU x 1, "
                                "largest free 1.5 GiB")

        await store.create(node("big", gpus=2, memory_mib=81559))

        async def placed():
            r = await _replica(store)
            return r if r and r.spec.placement else None
        rep = await until(placed)
        assert [p.node for p in rep.spec.placement] == ["big"]

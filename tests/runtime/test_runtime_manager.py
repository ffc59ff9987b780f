"""Controller manager: leader election, fencing, reconcile retries and metrics."""
import asyncio

import aiohttp
import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

from llmgw.api import Model, ModelSpec, ObjectMeta, Profile
from llmgw.dev.process import free_port
from llmgw.runtime.controller import Controller, Result
from llmgw.runtime.manager import Manager
from llmgw.runtime.metrics import serve
from llmgw.runtime.settings import ManagerSettings
from llmgw.store import FencedOut, Store
from tests.fixtures.gateway import metric
from tests.fixtures.poll import until


def model(name: str) -> Model:
    return Model(metadata=ObjectMeta(name=name), spec=ModelSpec(profiles=[Profile(engine="sim")]))


class Labeler(Controller):
    """Labels every model with the identity of the manager that reconciled it;
    fails the first `fail` reconciles of a model to exercise the retry path."""

    name = "labeler"
    watches = ("models",)

    def __init__(self, identity: str, fail: int = 0):
        self.identity = identity
        self.fail = fail
        self.calls: dict[str, int] = {}

    async def reconcile(self, key):
        self.calls[key] = self.calls.get(key, 0) + 1
        if self.calls[key] <= self.fail:
            raise RuntimeError("boom")
        m = self.ctx.cache.get(Model, key)
        if m is None or m.metadata.labels.get("by") == self.identity:
            return Result()
        m = m.model_copy(deep=True)
        m.metadata.labels["by"] = self.identity
        self.ctx.cache.assume(await self.ctx.store.update(m))
        self.ctx.events.record(m, "Normal", "Labeled", f"labeled by {self.identity}")
        return None


class Listener(Controller):
    """Remembers the newest revision of each model it was told about."""

    name = "listener"
    watches = ("models",)

    def __init__(self):
        self.heard: dict[str, int] = {}

    def keys_for(self, kind, obj):
        self.heard[obj.metadata.name] = max(self.heard.get(obj.metadata.name, 0), obj.revision)
        return []


class Writer(Labeler):
    """A Labeler that checks, right after each write, whether the listener knows of it."""

    def __init__(self, listener: Listener):
        super().__init__("writer")
        self.listener = listener
        self.told: list[bool] = []

    async def reconcile(self, key):
        before = self.ctx.cache.get(Model, key)
        await super().reconcile(key)
        after = self.ctx.cache.get(Model, key)
        if after is not None and after is not before:
            self.told.append(self.listener.heard.get(key, 0) >= after.revision)


async def test_a_write_reaches_the_other_controllers_before_its_watch_event(store):
    listener = Listener()
    writer = Writer(listener)
    mgr = Manager(store, [writer, listener], identity="solo", settings=ManagerSettings(lease_seconds=2))
    task = asyncio.create_task(mgr.run())
    try:
        await store.create(model("b"))
        await until(lambda: writer.told)
        assert writer.told == [True]          # told when the writer assumed it, not later by the watch
    finally:
        await mgr.stop()
        task.cancel()


@pytest.mark.serial   # it times the failover: alone
async def test_a_warm_standby_takes_over_within_a_lease_and_deposed_leader_is_fenced(etcd):
    stores = [await Store(etcd.endpoint).connect() for _ in range(2)]
    managers = [Manager(s, [Labeler(f"m{i}")], identity=f"m{i}", settings=ManagerSettings(lease_seconds=2))
                for i, s in enumerate(stores)]
    tasks = [asyncio.create_task(m.run()) for m in managers]
    try:
        await stores[0].create(model("a"))
        await until(lambda: any(m.is_leader for m in managers))
        leader = next(m for m in managers if m.is_leader)
        other = next(m for m in managers if m is not leader)
        await until(lambda: (leader.cache.get(Model, "a") or model("x")).metadata.labels.get("by")
                    == leader.identity)
        assert not other.is_leader
        # a warm standby: its cache follows the store (the leader's label too) before it leads
        await until(lambda: (other.cache.get(Model, "a") or model("x")).metadata.labels.get("by")
                    == leader.identity)
        assert other.controllers[0].calls == {}   # and nothing of it reached its controller
        fenced = leader.controllers[0].ctx.store

        await leader.stop(resign=False)           # a crash: the leader key is left to expire
        t0 = asyncio.get_running_loop().time()
        await stores[1].create(model("b"))        # new while nobody leads
        await until(lambda: other.is_leader, timeout=30)
        took = asyncio.get_running_loop().time() - t0
        # the new leader reconciles what it heard of as standby, and everything it holds once
        await until(lambda: (other.cache.get(Model, "b") or model("x")).metadata.labels.get("by") == other.identity)
        await until(lambda: (other.cache.get(Model, "a") or model("x")).metadata.labels.get("by") == other.identity)
        # ... without listing again: one list per informer, made while it was standby
        assert metric(other.metrics.exposition().decode(), "llmgw_informer_lists_total", kind="models") == 1
        # the new leader got in roughly one lease (2 s) after the crash, not much later
        assert took < 2 * 3 + 5, took

        current = await stores[1].get(Model, "a")
        current.metadata.labels["by"] = "deposed"
        with pytest.raises(FencedOut):
            await fenced.update(current)
        assert (await stores[1].get(Model, "a")).metadata.labels["by"] == other.identity
    finally:
        for m in managers:
            await m.stop()
        for t in tasks:
            t.cancel()
        for s in stores:
            await s.close()


async def test_failed_reconcile_retries_and_metrics_show_it(store):
    ctrl = Labeler("solo", fail=3)
    mgr = Manager(store, [ctrl], identity="solo", settings=ManagerSettings(lease_seconds=2))
    port = free_port()
    runner = await serve(mgr.metrics, mgr.healthy, "127.0.0.1", port)
    task = asyncio.create_task(mgr.run())
    try:
        await store.create(model("b"))
        await until(lambda: mgr.is_leader
                    and (mgr.cache.get(Model, "b") or model("x")).metadata.labels.get("by") == "solo")
        assert ctrl.calls["b"] >= 4
        assert mgr.events.find(name="b", reason="Labeled")
        async with aiohttp.ClientSession() as http:
            async with http.get(f"http://127.0.0.1:{port}/metrics") as resp:
                text = await resp.text()
            async with http.get(f"http://127.0.0.1:{port}/healthz") as resp:
                assert resp.status == 200
                assert "leader=True" in await resp.text()
        assert 'llmgw_controller_reconcile_errors_total{controller="labeler"} 3.0' in text
        assert 'llmgw_controller_queue_retries_total{controller="labeler"} 3.0' in text
        assert metric(text, "llmgw_controller_queue_adds_total", controller="labeler") >= 4
        assert (metric(text, "llmgw_controller_queue_wait_seconds_count", controller="labeler")
                >= metric(text, "llmgw_controller_reconcile_duration_seconds_count", controller="labeler") >= 4)
        assert 'llmgw_controller_queue_depth{controller="labeler"}' in text
        assert "llmgw_controller_manager_leader 1.0" in text
        async def stored():   # the recorder writes events to the store in the background
            return any(e["reason"] == "Labeled" for e in await store.events.list("models", "b"))
        await until(stored, "the Labeled event in the store")
    finally:
        await mgr.stop()
        task.cancel()
        await runner.cleanup()


class Reporter(Controller):
    """Reports its first `fail` failures itself (as the gitops controller does in a status): each
    retried after the key's backoff, which keeps growing; a success forgets it."""

    name = "reporter"
    watches = ("models",)
    retry_base, retry_max = 0.05, 1.0

    def __init__(self, fail: int):
        self.fail = fail
        self.delays: list[float] = []
        self.succeeded = self.stopped = False

    async def reconcile(self, key):
        if len(self.delays) < self.fail:
            self.delays.append(self.ctx.queue.add_rate_limited(key))
            return Result(keep_backoff=True)
        self.succeeded = True
        return None

    async def stop(self):
        self.stopped = True


async def test_a_failure_the_controller_reports_retries_after_its_growing_backoff(store):
    ctrl = Reporter(fail=3)
    mgr = Manager(store, [ctrl], identity="solo", settings=ManagerSettings(lease_seconds=2))
    task = asyncio.create_task(mgr.run())
    try:
        await store.create(model("b"))
        await until(lambda: ctrl.succeeded, "b reconciled after three reported failures")
        # the third wait of 0.05 s doubling, less up to half: forgotten between tries, it would be the first's
        assert len(ctrl.delays) == 3 and ctrl.delays[0] <= 0.05 and ctrl.delays[2] >= 0.1
        assert mgr.queues["reporter"].num_requeues("b") == 0
        assert not ctrl.stopped
    finally:
        await mgr.stop()
        task.cancel()
    assert ctrl.stopped      # the term's end stops what a controller runs beside its workers


async def test_each_reconcile_is_a_span_with_what_it_raised(store):
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    mgr = Manager(store, [Labeler("traced", fail=2)], identity="traced", settings=ManagerSettings(lease_seconds=2))
    mgr.tracer = provider.get_tracer("test")
    task = asyncio.create_task(mgr.run())
    try:
        await store.create(model("t"))
        await until(lambda: mgr.is_leader
                    and (mgr.cache.get(Model, "t") or model("x")).metadata.labels.get("by") == "traced")
    finally:
        await mgr.stop()
        task.cancel()
    spans = [s for s in exporter.get_finished_spans() if (s.attributes or {}).get("llmgw.key") == "t"]
    assert [s.name for s in spans[:3]] == ["reconcile labeler"] * 3
    failed, ok = spans[:2], spans[2]
    assert all(s.status.status_code is StatusCode.ERROR and s.events[0].name == "exception"
               and s.events[0].attributes["exception.type"] == "RuntimeError" for s in failed)
    assert ok.status.status_code is not StatusCode.ERROR
    assert dict(ok.attributes or {}) == {"llmgw.controller": "labeler", "llmgw.key": "t", "llmgw.term": 1}

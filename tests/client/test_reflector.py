"""The reflector (llmgw.reflector) over a real server and etcd: a relist after 410 reports what
vanished as DELETED; a dropped watch resumes from the last revision, without a relist."""
from __future__ import annotations

import asyncio

from llmgw.api import Model, parse_object
from llmgw.backoff import Backoff
from llmgw.reflector import Reflector
from llmgw.store import Compactor, Store
from tests.fixtures.cluster import api_server, ca_dir, start_api_server  # noqa: F401
from tests.fixtures.poll import until


def model(name):
    return parse_object({"apiVersion": "llmgw.io/v1", "kind": "Model", "metadata": {"name": name},
                         "spec": {"profiles": [{"engine": "sim"}]}})


def name(obj):
    return obj.metadata.name


class Held:
    """A lister-watcher whose watches wait for `gate` (changes meanwhile go unseen); it records
    the revision each watch starts from."""

    def __init__(self, lw):
        self.lw = lw
        self.gate = asyncio.Event()
        self.watched_from = []

    async def list(self):
        return await self.lw.list()

    async def watch(self, from_revision):
        self.watched_from.append(from_revision)
        await self.gate.wait()
        async for ev in self.lw.watch(from_revision):
            yield ev

    def after_error(self, err):
        return self.lw.after_error(err)


class Events(list):
    def __call__(self, type_, obj, revision):
        self.append((type_, obj.metadata.name, obj.metadata.uid))

    def of(self, who):
        return [t for t, n, _ in self if n == who]


async def test_a_relist_after_410_reports_what_vanished_as_deleted(api_server, store):
    async with api_server.client() as c:
        gone = await c.create(model("gone"))
        stays = await c.create(model("stays"))
        lw, events = Held(c.lister_watcher(Model)), Events()
        reflector = Reflector(lw, events, key=name)
        task = asyncio.create_task(reflector.run())
        try:
            await until(lambda: reflector.lists == 1)
            assert sorted(events) == [("ADDED", "gone", gone.metadata.uid), ("ADDED", "stays", stays.metadata.uid)]
            await c.delete(Model, "gone")
            new = await c.create(model("new"))
            await Compactor(store.etcd, keep=0).compact()
            lw.gate.set()                  # the watch from the list's revision is told 410: relist
            await until(lambda: reflector.lists == 2)
            assert events.of("gone") == ["ADDED", "DELETED"]
            assert events[-2:] in ([("ADDED", "new", new.metadata.uid), ("DELETED", "gone", gone.metadata.uid)],
                                   [("DELETED", "gone", gone.metadata.uid), ("ADDED", "new", new.metadata.uid)])
            assert events.of("stays") == ["ADDED"]      # unchanged across the relist: not reported again
            await c.create(model("later"))              # and it watches on after the relist
            await until(lambda: events.of("later") == ["ADDED"])
        finally:
            task.cancel()


async def test_a_dropped_watch_resumes_from_the_last_revision_without_a_relist(etcd, ca_dir, tmp_path):
    server = start_api_server(ca_dir, etcd.endpoint, tmp_path)
    try:
        async with server.client() as c, Store(etcd.endpoint) as store:
            lw, events = Held(c.lister_watcher(Model)), Events()
            lw.gate.set()
            reflector = Reflector(lw, events, key=name, backoff=Backoff(0.05, 0.5))
            task = asyncio.create_task(reflector.run())
            try:
                await until(lambda: reflector.lists == 1 and lw.watched_from)
                before = await c.create(model("before-drop"))
                await until(lambda: events.of("before-drop") == ["ADDED"])
                assert reflector.revision == before.metadata.resourceVersion
                await asyncio.to_thread(server.stop)       # the watch drops
                await until(lambda: len(lw.watched_from) >= 2)
                await store.create(model("while-down"))    # etcd has it; the server is away
                await asyncio.to_thread(server.restart)
                await until(lambda: events.of("while-down") == ["ADDED"])
                assert reflector.lists == 1
                assert set(lw.watched_from[1:]) == {before.metadata.resourceVersion + 1}
                assert events.of("before-drop") == ["ADDED"]
            finally:
                task.cancel()
    finally:
        server.stop()


class CutOnceOpen:
    """A lister-watcher whose every watch opens, then is cut ("resume": it was established)."""

    def __init__(self):
        self.watches = 0

    async def list(self):
        return [], 1

    async def watch(self, from_revision):
        self.watches += 1
        raise ConnectionResetError("cut")
        yield  # an async generator, as a client's watch

    def after_error(self, err):
        return "resume"


async def test_a_watch_established_again_starts_its_backoff_over():
    """No event came, yet each watch was established before it was cut: the waits do not grow."""
    lw = CutOnceOpen()
    reflector = Reflector(lw, lambda *_: None, key=name, backoff=Backoff(0.01, 10.0))
    task = asyncio.create_task(reflector.run())
    try:
        await until(lambda: lw.watches >= 4)
        assert reflector.backoff.failures == 1
    finally:
        task.cancel()

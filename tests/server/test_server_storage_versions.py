"""Stored objects that outlive their schema (docs/contracts.md, "Storage versions"), with the field that
tests/fixtures/renamed_field.py renames: a Model stored by the older version is converted on read, left
as stored until it changes, rewritten by `llmgw ctl migrate-storage`, and the removed field is refused
on apply naming its replacement."""
from __future__ import annotations

import asyncio
import json

from click.testing import CliRunner, Result

import tests.fixtures.renamed_field as renamed  # registers the conversion here too, for migrate-storage
from llmgw.api import Model, parse_object
from llmgw.cli.main import cli
from llmgw.store import Store
from tests.fixtures.cluster import ca_dir, start_api_server  # noqa: F401

KEY = "/llmgw/spec/models/old"


def model(name: str) -> Model:
    obj = parse_object({"apiVersion": "llmgw.io/v1", "kind": "Model", "metadata": {"name": name},
                        "spec": {"replicas": 3, "profiles": [{"engine": "sim"}]}})
    assert isinstance(obj, Model)
    return obj


async def migrate_storage(endpoint: str) -> Result:
    """The real command, in this process (which knows the renamed field), off the event loop it runs its own."""
    return await asyncio.to_thread(CliRunner().invoke, cli, ["ctl", "migrate-storage", "--etcd", endpoint])


async def stored(store: Store) -> dict:
    found = await store.kv.get(KEY)
    assert found is not None
    return json.loads(found[0])


async def test_a_renamed_field_is_converted_on_read_migrated_and_refused_on_apply(etcd, ca_dir, tmp_path):
    server = start_api_server(ca_dir, etcd.endpoint, tmp_path, command=renamed.SERVER)
    try:
        async with Store(etcd.endpoint) as store, server.client() as c:
            await c.create(model("old"))
            # as the older version stored it
            doc = await stored(store)
            doc["apiVersion"], doc["spec"]["replicaCount"] = renamed.OLD, doc["spec"].pop("replicas")
            await store.kv.put(KEY, json.dumps(doc).encode())

            got = await c.get(Model, "old")
            assert got.spec.replicas == 3 and got.metadata.generation == 1   # converted on read
            assert await c.update(got) == got   # an update that changes nothing writes nothing
            assert (await stored(store))["apiVersion"] == renamed.OLD

            result = await migrate_storage(etcd.endpoint)
            assert result.exit_code == 0, result.output
            assert "models        1 migrated, 0 current" in result.output, result.output
            assert "nodes         0 migrated, 0 current" in result.output
            after = await stored(store)
            assert after["apiVersion"] == "llmgw.io/v1" and after["spec"]["replicas"] == 3
            assert "replicaCount" not in after["spec"]
            migrated = await c.get(Model, "old")
            assert migrated.metadata.generation == 1 and migrated.metadata.uid == got.metadata.uid
            again = await migrate_storage(etcd.endpoint)
            assert "models        0 migrated, 1 current" in again.output, again.output

            body = model("new").model_dump(mode="json", exclude={"status"})
            body["spec"]["replicaCount"] = body["spec"].pop("replicas")
            code, answer = server.send(server.admin, "POST", "/models/new/apply", json.dumps(body).encode())
            assert code == 422, answer
            assert "spec.replicaCount: removed in llmgw 0.2.0; use spec.replicas" in answer["message"], answer
    finally:
        server.stop()


async def test_migrate_storage_never_overwrites_a_concurrent_change(store):
    """A server's write lands between migrate's read and its compare-and-swap (in the Model's write
    hook, which runs there): the swap fails, the object is read again, current now, and left as written."""
    await store.create(model("old"))
    doc = await stored(store)
    doc["apiVersion"], doc["spec"]["replicaCount"] = renamed.OLD, doc["spec"].pop("replicas")
    await store.kv.put(KEY, json.dumps(doc).encode())
    names = store.hooks[Model]

    class Concurrent:
        async def guard(self, before, after):
            if after is not None and after.spec.replicas == 3:   # migrate's write: a newer one first
                newer = {**doc, "apiVersion": "llmgw.io/v1", "spec": {**doc["spec"], "replicas": 5}}
                del newer["spec"]["replicaCount"]
                await store.kv.put(KEY, json.dumps(newer).encode())
            return await names.guard(before, after)
    store.hooks[Model] = Concurrent()

    assert await store.migrate(Model) == (0, 1)
    assert (await stored(store))["spec"]["replicas"] == 5
    assert (await store.get(Model, "old")).spec.replicas == 5

"""A name or alias is served by one Model only: the store refuses a Model that would take
another's, under concurrent writes too (reservation keys under /llmgw/names/, real etcd)."""
from __future__ import annotations

import asyncio

import pytest

from llmgw.api import Model, parse_object
from llmgw.api.errors import Conflict
from llmgw.store import NameTaken, NotFound
from tests.fixtures.cluster import api_server, ca_dir  # noqa: F401

V1 = "llmgw.io/v1"


def model(name: str, *aliases: str, finalizers: tuple[str, ...] = ()):
    return parse_object({"apiVersion": V1, "kind": "Model",
                         "metadata": {"name": name, "finalizers": list(finalizers)},
                         "spec": {"aliases": list(aliases), "profiles": [{"engine": "sim"}]}})


async def reservations(store) -> dict[str, str]:
    items, _ = await store.kv.list("/llmgw/names/")
    return {key.rsplit("/", 1)[1]: value.decode() for key, value, _ in items}


async def test_a_name_or_alias_of_another_model_is_refused_naming_the_holder(store):
    await store.create(model("big", "large"))
    with pytest.raises(NameTaken) as err:
        await store.create(model("thief", "large"))
    assert str(err.value) == ("Model 'thief': the alias 'large' is an alias of Model 'big'; "
                              "a name or alias is served by one Model only")
    with pytest.raises(NameTaken) as err:
        await store.create(model("large"))
    assert str(err.value).startswith("Model 'large': its name 'large' is an alias of Model 'big'")
    with pytest.raises(NameTaken) as err:
        await store.create(model("other", "big"))
    assert str(err.value).startswith("Model 'other': the alias 'big' is the name of Model 'big'")
    with pytest.raises(NotFound):
        await store.get(Model, "thief")  # nothing of a refused create was written
    assert await reservations(store) == {"big": "big", "large": "big"}


async def test_an_update_that_takes_a_name_is_refused_and_dropped_aliases_are_freed(store):
    await store.create(model("a", "small"))
    b = await store.create(model("b"))
    b.spec.aliases = ["small"]
    with pytest.raises(NameTaken):
        await store.update(b)
    assert (await store.get(Model, "b")).spec.aliases == []

    a = await store.get(Model, "a")
    a.spec.aliases = ["tiny"]
    await store.update(a)
    assert await reservations(store) == {"a": "a", "b": "b", "tiny": "a"}
    b.spec.aliases = ["small"]
    await store.update(b)  # small is free now
    assert (await reservations(store))["small"] == "b"


async def test_a_deleted_model_frees_its_names_after_its_finalizers(store):
    await store.create(model("gone", "g1", finalizers=("test/hold",)))
    await store.delete(Model, "gone")
    with pytest.raises(NameTaken):  # still there, terminating: its replicas may still serve
        await store.create(model("next", "g1"))
    held = await store.get(Model, "gone")
    held.metadata.finalizers = []
    await store.update(held)  # the last finalizer went: the real delete
    await store.create(model("next", "g1", "gone"))
    assert await reservations(store) == {"next": "next", "g1": "next", "gone": "next"}


async def test_of_concurrent_writes_claiming_one_alias_exactly_one_wins(store):
    results = await asyncio.gather(*(store.create(model(f"racer{i}", "contested")) for i in range(12)),
                                   return_exceptions=True)
    winners = [r.name for r in results if not isinstance(r, BaseException)]
    assert len(winners) == 1, results
    assert all(isinstance(r, NameTaken) for r in results if isinstance(r, BaseException)), results
    assert (await reservations(store))["contested"] == winners[0]

    # writes of different names do not wait on each other's names: all land
    results = await asyncio.gather(*(store.create(model(f"calm{i}", f"calm-alias{i}")) for i in range(12)))
    assert len(results) == 12


async def legacy(store, m) -> None:
    """Store `m` as an older llmgw did: the spec key alone, no /llmgw/names/ keys."""
    await store.kv.put(f"/llmgw/spec/models/{m.name}", m.model_dump_json(exclude={"status": True}).encode())


async def test_the_migration_reserves_the_names_of_models_stored_before_reservations(store):
    await legacy(store, model("old", "old-alias"))
    await store.create(model("new", "new-alias"))
    done = await store.names.migrate()
    assert (done.reserved, done.conflicts) == ({"old": "old", "old-alias": "old"}, [])
    assert await reservations(store) == {"old": "old", "old-alias": "old", "new": "new", "new-alias": "new"}
    with pytest.raises(NameTaken) as err:
        await store.create(model("thief", "old-alias"))
    assert str(err.value).startswith("Model 'thief': the alias 'old-alias' is an alias of Model 'old'")
    current = await store.get(Model, "old")
    current.spec.aliases = ["another"]
    await store.update(current)  # its own names are its own; a dropped one is freed
    assert await reservations(store) == {"old": "old", "another": "old", "new": "new", "new-alias": "new"}
    again = await store.names.migrate()
    assert (again.reserved, again.conflicts) == ({}, [])


async def test_the_migration_reports_a_name_two_stored_models_both_serve(store):
    await store.create(model("first", "shared"))
    await legacy(store, model("second", "shared", "own"))
    done = await store.names.migrate()
    assert done.reserved == {"second": "second", "own": "second"}
    assert done.conflicts == [("second", "shared", "first")]
    assert (await reservations(store))["shared"] == "first"


async def test_the_server_migrates_at_start(store, api_server):
    await legacy(store, model("old", "old-alias"))
    await asyncio.to_thread(api_server.restart)
    assert "reserved 2 served name(s)" in api_server.wait_for_log("served name(s)")
    async with api_server.client() as c:
        with pytest.raises(Conflict) as err:
            await c.create(model("thief", "old-alias"))
    assert err.value.reason == "NameTaken"
    assert await reservations(store) == {"old": "old", "old-alias": "old"}

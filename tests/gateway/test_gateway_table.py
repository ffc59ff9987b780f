"""The routing table and the balancer: pure structures, fed (type, obj) events."""
from __future__ import annotations

import copy
from datetime import datetime, timezone

from hypothesis import given, settings
from hypothesis import strategies as st

from llmgw.api import AdapterSlots, RoutingSpec
from llmgw.gateway.balancer import Balancer
from llmgw.gateway.table import RoutingTable
from tests.fixtures.gateway import lora, model, replica


def table_with(*events) -> RoutingTable:
    t = RoutingTable()
    for kind, type_, obj in events:
        t.apply(kind, type_, obj)
    return t


def names(backends) -> list[str]:
    return [b.replica for b in backends]


def test_only_ready_replicas_with_an_endpoint_and_no_deletion_are_routable():
    t = table_with(
        ("models", "ADDED", model("llama", aliases=("small",))),
        ("replicas", "ADDED", replica("r-ready", "llama", "10.0.0.1:30000")),
        ("replicas", "ADDED", replica("r-starting", "llama", "10.0.0.2:30000", phase="Starting")),
        ("replicas", "ADDED", replica("r-noaddr", "llama", None)),
        ("replicas", "ADDED", replica("r-deleting", "llama", "10.0.0.3:30000", deleting=True)),
    )
    assert names(t.backends_for("llama")) == ["r-ready"]
    assert t.resolve("llama") == t.resolve("small") == "llama"
    assert t.resolve("other") is None


def test_deletion_timestamp_removes_a_replica_at_once_and_ready_brings_it_back():
    t = table_with(("models", "ADDED", model("llama")),
                   ("replicas", "ADDED", replica("a", "llama", "h:1")),
                   ("replicas", "ADDED", replica("b", "llama", "h:2")))
    assert t.apply("replicas", "MODIFIED", replica("a", "llama", "h:1", phase="Ready", deleting=True))
    assert names(t.backends_for("llama")) == ["b"]
    assert t.apply("replicas", "MODIFIED", replica("b", "llama", "h:2", phase="Failed"))
    assert t.backends_for("llama") == []
    assert t.resolve("llama") == "llama"  # still known: a 503, not a 404
    t.apply("replicas", "MODIFIED", replica("b", "llama", "h:9"))
    assert [b.endpoint for b in t.backends_for("llama")] == ["h:9"]
    assert not t.apply("replicas", "MODIFIED", replica("b", "llama", "h:9")), "no change, no bump"


def test_replace_drops_what_a_relist_no_longer_has():
    t = table_with(("models", "ADDED", model("llama")),
                   ("replicas", "ADDED", replica("a", "llama", "h:1")),
                   ("replicas", "ADDED", replica("b", "llama", "h:2")))
    t.replace("replicas", [replica("b", "llama", "h:2").model_dump(mode="json")])  # dicts are accepted too
    assert names(t.backends_for("llama")) == ["b"]
    t.replace("models", [])
    assert t.models == {}
    # A replica whose Model is gone still answers to its own names while it lives.
    assert t.resolve("llama") == "llama"


def test_aliases_follow_model_changes_and_a_model_name_beats_another_alias():
    t = table_with(("models", "ADDED", model("llama", aliases=("chat",))),
                   ("models", "ADDED", model("chat")),
                   ("replicas", "ADDED", replica("a", "llama", "h:1")))
    assert t.resolve("chat") == "chat"
    t.apply("models", "MODIFIED", model("llama", aliases=("fast",)))
    assert t.resolve("fast") == "llama"
    assert t.known_names() == ["chat", "fast", "llama"]
    assert [m for m, _, _ in t.routable_models()] == ["llama"]
    t.apply("models", "DELETED", model("chat"))
    assert t.resolve("chat") is None


def test_backend_rewrites_the_model_only_for_an_engine_that_does_not_serve_the_name():
    t = table_with(("models", "ADDED", model("llama", aliases=("fast",))),
                   ("replicas", "ADDED", replica("old", "llama", "h:1", served=("llama",))),
                   ("replicas", "ADDED", replica("new", "llama", "h:2", served=("llama", "fast"))))
    new, old = t.backends_for("llama")  # sorted by replica name
    assert old.upstream_fields("fast") == {"model": "llama"}
    assert new.upstream_fields("fast") == {}
    assert old.upstream_fields("llama") == {}


def least(bal: Balancer, backends, exclude=()):
    """least-outstanding's choice, as the gateway owning `bal` makes it for model m."""
    return bal.policy("m", DEFAULT).pick(backends, bal.inflight, None, exclude)


DEFAULT = RoutingSpec()


def test_least_outstanding_wins_and_ties_go_round_robin():
    t = table_with(("models", "ADDED", model("m")),
                   *[("replicas", "ADDED", replica(n, "m", f"h:{i}")) for i, n in enumerate("abc")])
    bal = Balancer()
    backends = t.backends_for("m")
    picks = [least(bal, backends).replica for _ in range(6)]
    assert picks == ["a", "b", "c", "a", "b", "c"]
    a, b, c = backends
    bal.acquire(a), bal.acquire(b), bal.acquire(b)
    assert [least(bal, backends).replica for _ in range(3)] == ["c"] * 3
    bal.acquire(c)
    assert least(bal, backends).replica == "a"  # a=1 b=2 c=1: a or c, round robin
    assert least(bal, backends, ["a", "c"]).replica == "b"
    assert least(bal, backends, ["a", "b", "c"]) is None
    for x in (a, b, b, c):
        bal.release(x)
    assert bal.inflight == {} and bal.model_of == {}


def test_an_adapter_routes_to_the_replicas_of_its_base_where_it_is_resident():
    base = model("llama").model_copy(deep=True)
    base.spec.routing = RoutingSpec(policy="prefix-hash")
    t = table_with(("models", "ADDED", base),
                   ("replicas", "ADDED", replica("a", "llama", "h:1")),
                   ("replicas", "ADDED", replica("b", "llama", "h:2")),
                   ("replicas", "ADDED", replica("c", "other", "h:3")),
                   ("adapters", "ADDED", lora("sql", "llama")))
    assert t.resolve("sql") == "sql" and t.backends_for("sql") == [], "known, resident nowhere: it waits"
    assert t.routing("sql") is base.spec.routing
    assert t.apply("adapters", "MODIFIED", lora("sql", "llama", ("b", "c", "gone")))
    [b] = t.backends_for("sql")       # c is another model's replica, gone is no replica
    assert (b.replica, b.endpoint, b.upstream_fields("sql")) == ("b", "h:2", {}), "the body goes as it is"
    assert t.routable_adapters()[0][:2] == ("sql", "llama")
    assert [m for m, _, _ in t.routable_models()] == ["llama", "other"]
    assert t.apply("replicas", "MODIFIED", replica("b", "llama", "h:2", phase="Starting"))
    assert t.backends_for("sql") == [] and t.routable_adapters() == []
    assert t.apply("adapters", "DELETED", lora("sql", "llama"))
    assert t.resolve("sql") is None


def test_a_models_name_wins_over_an_adapters():
    t = table_with(("models", "ADDED", model("llama", aliases=("sql",))),
                   ("replicas", "ADDED", replica("a", "llama", "h:1")),
                   ("adapters", "ADDED", lora("sql", "llama", ("a",))))
    assert t.resolve("sql") == "llama" and t.routable_adapters() == []
    assert t.replace("adapters", []) is True and t.adapters == {}



def test_an_adapter_is_named_to_each_engine_its_own_way():
    """vLLM and the sim answer to the adapter's name; SGLang to BASE:ADAPTER (its served name);
    llama-server to the adapter's id, its place among its base's adapters oldest first, and a
    request for its base runs with no adapter and no prefix cached under one."""
    def adapter(name: str, base: str, created: int, resident: tuple[str, ...]):
        a = lora(name, base, resident).model_copy(deep=True)
        a.metadata.creationTimestamp = datetime.fromtimestamp(created, timezone.utc)
        return a
    llama = replica("l", "tiny", "h:1", served=("tiny",), engine="llamacpp").model_copy(deep=True)
    llama.spec.adapters = AdapterSlots(maxLoaded=4)
    t = table_with(("replicas", "ADDED", llama),
                   ("replicas", "ADDED", replica("s", "qwen", "h:2", served=("qwen", "q"), engine="sglang")),
                   ("adapters", "ADDED", adapter("zeta", "tiny", 100, ("l",))),
                   ("adapters", "ADDED", adapter("alpha", "tiny", 200, ("l",))),
                   ("adapters", "ADDED", adapter("sql", "qwen", 100, ("s",))))
    assert t.backends_for("zeta")[0].upstream_fields("zeta") == {"lora": [{"id": 0, "scale": 1.0}]}
    assert t.backends_for("alpha")[0].upstream_fields("alpha") == {"lora": [{"id": 1, "scale": 1.0}]}
    assert t.backends_for("tiny")[0].upstream_fields("tiny") == {"lora": [], "cache_prompt": False}
    assert t.backends_for("sql")[0].upstream_fields("sql") == {"model": "qwen:sql"}


REPLICAS = ("a", "b", "o", "gone")      # a and b serve llama; o serves other; gone is no replica
ADAPTERS = ("sql", "code", "chat", "other")
# One step: an Adapter's status (its base llama, or "other" when rebased: the adapters' places in
# their bases' start orders move) or its deletion, this gateway's own load or eviction of it (or
# the agent keeping it), a replica's phase, or a Model named like an adapter coming and going.
STEPS = st.one_of(
    st.tuples(st.sampled_from(["status", "rebased"]), st.sampled_from(ADAPTERS), st.sets(st.sampled_from(REPLICAS))),
    st.tuples(st.just("delete"), st.sampled_from(ADAPTERS), st.just(frozenset())),
    st.tuples(st.sampled_from(["loaded", "evicted", "unloaded", "kept"]), st.sampled_from(ADAPTERS),
              st.sets(st.sampled_from(REPLICAS), min_size=1, max_size=1)),
    st.tuples(st.sampled_from(["ready", "starting"]), st.sampled_from(REPLICAS[:3]), st.just(frozenset())),
    st.tuples(st.sampled_from(["shadow", "unshadow"]), st.just("chat"), st.just(frozenset())))


@settings(max_examples=200, deadline=None)
@given(st.lists(STEPS, max_size=40))
def test_an_adapters_routing_changed_alone_is_the_routing_the_whole_table_gives(steps):
    """An Adapter's residency changes (its status, this gateway's direct loads and evictions) route
    that adapter anew, not the whole table: after every step its routes, each replica's adapters
    and every name resolve as a table indexed from scratch says."""
    t = table_with(("models", "ADDED", model("llama")), ("models", "ADDED", model("other")),
                   ("replicas", "ADDED", replica("a", "llama", "h:1")),
                   ("replicas", "ADDED", replica("b", "llama", "h:2")),
                   ("replicas", "ADDED", replica("o", "other", "h:3")),
                   *(("adapters", "ADDED", lora(n, "llama", ("a",))) for n in ADAPTERS[:3]),
                   ("adapters", "ADDED", lora("other", "other", ("o",))))
    for step, name, replicas in steps:
        r = min(replicas, default="")     # the one replica of a load, an eviction or an unload
        base = "other" if name == "other" or step == "rebased" else "llama"
        if step in ("status", "rebased"):
            t.apply("adapters", "MODIFIED", lora(name, base, tuple(sorted(replicas))))
        elif step == "delete":
            t.apply("adapters", "DELETED", lora(name, base))
        elif step == "loaded":
            t.loaded(name, r)
        elif step == "evicted":
            t.evicted(name, r, 60.0)
        elif step == "unloaded":
            t.unloaded(name, r)
        elif step == "kept":
            t.kept(name, r)
        elif step in ("ready", "starting"):
            t.apply("replicas", "MODIFIED", replica(name, "other" if name == "o" else "llama", "h:9",
                                                    phase="Ready" if step == "ready" else "Starting"))
        else:
            t.apply("models", "ADDED" if step == "shadow" else "DELETED", model("chat"))
        whole = copy.deepcopy(t)
        whole._reindex()
        names = {*ADAPTERS, *REPLICAS, "llama", "other"}
        assert {n: t.backends_for(n) for n in names} == {n: whole.backends_for(n) for n in names}, step
        assert {r: sorted(held) for r, held in t.held.items()} == \
            {r: sorted(held) for r, held in whole.held.items()}, step
        assert {n: t.resolve(n) for n in names} == {n: whole.resolve(n) for n in names}, step

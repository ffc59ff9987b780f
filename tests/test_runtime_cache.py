"""Cache: indexes, assume ordering, and that assumed writes still reach handlers."""
from llmgw.api import Replica
from llmgw.runtime.cache import Cache


def rep(name, model="m", nodes=(), rv=1, phase="Pending") -> Replica:
    return Replica.model_validate({"metadata": {"name": name, "resourceVersion": rv, "uid": name}, "spec": {
        "model": model, "templateHash": "t", "profile": {"engine": "sim", "nodes": max(1, len(nodes))},
        "placement": [{"rank": i, "node": n} for i, n in enumerate(nodes)]}, "status": {"phase": phase}})


def test_indexes_follow_changes():
    c = Cache()
    c.apply("replicas", "ADDED", rep("a", nodes=("n1", "n2")), 5)
    c.apply("replicas", "ADDED", rep("b", model="x", nodes=("n2",)), 6)
    assert sorted(r.name for r in c.index("replicas", "node", "n2")) == ["a", "b"]
    c.apply("replicas", "MODIFIED", rep("a", nodes=("n3",), rv=7), 7)
    assert [r.name for r in c.index("replicas", "node", "n2")] == ["b"]
    assert [r.name for r in c.index("replicas", "model", "m")] == ["a"]
    c.apply("replicas", "DELETED", rep("b", model="x"), 8)
    assert c.index("replicas", "model", "x") == [] and c.get("replicas", "b") is None


def test_assumed_object_survives_older_events_and_yields_to_newer():
    c = Cache()
    c.apply("replicas", "ADDED", rep("a", rv=5), 5)
    c.assume(rep("a", rv=9, phase="Ready"))                 # our update, written at 9
    changed, _ = c.apply("replicas", "MODIFIED", rep("a", rv=7, phase="Failed"), 7)   # older than our write
    assert changed                                           # handlers still hear of it
    assert c.get("replicas", "a").status.phase == "Ready"
    c.apply("replicas", "MODIFIED", rep("a", rv=10, phase="Starting"), 10)
    assert c.get("replicas", "a").status.phase == "Starting"
    c.assume(rep("a", rv=3, phase="Pending"))                # stale: a newer one is cached
    assert c.get("replicas", "a").status.phase == "Starting"


def test_assumed_delete_hides_stale_events_but_reports_the_delete():
    c = Cache()
    c.apply("replicas", "ADDED", rep("a", rv=5), 5)
    c.assume_deleted("replicas", "a")
    assert c.apply("replicas", "MODIFIED", rep("a", rv=6), 6) == (False, None)
    assert c.get("replicas", "a") is None
    assert c.apply("replicas", "DELETED", rep("a", rv=7), 7)[0] is True


def test_relist_reports_vanished_objects():
    c = Cache()
    c.apply("replicas", "ADDED", rep("a"), 1)
    c.apply("replicas", "ADDED", rep("b"), 2)
    events = c.replace("replicas", [rep("b", rv=3), rep("c", rv=4)], 10)
    assert sorted((t, o.name) for t, o in events) == [("ADDED", "c"), ("DELETED", "a"), ("MODIFIED", "b")]

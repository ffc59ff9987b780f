"""Cache: indexes, assume ordering, and that assumed writes still reach handlers."""
import pytest

from controllers.indexes import REPLICAS_BY_MODEL, REPLICAS_BY_NODE
from llmgw.api import Replica
from llmgw.runtime.cache import Cache, Index


def rep(name, model="m", nodes=(), rv=1, phase="Pending") -> Replica:
    return Replica.model_validate({"metadata": {"name": name, "resourceVersion": rv, "uid": name}, "spec": {
        "model": model, "templateHash": "t", "profile": {"engine": "sim", "nodes": max(1, len(nodes))},
        "placement": [{"rank": i, "node": n} for i, n in enumerate(nodes)]}, "status": {"phase": phase}})


def test_indexes_follow_changes():
    c = Cache(indexes=(REPLICAS_BY_NODE, REPLICAS_BY_MODEL))
    c.apply("replicas", "ADDED", rep("a", nodes=("n1", "n2")), 5)
    c.apply("replicas", "ADDED", rep("b", model="x", nodes=("n2",)), 6)
    assert sorted(r.name for r in c.index(Replica, "node", "n2")) == ["a", "b"]
    c.apply("replicas", "MODIFIED", rep("a", nodes=("n3",), rv=7), 7)
    assert [r.name for r in c.index(Replica, "node", "n2")] == ["b"]
    assert [r.name for r in c.index(Replica, "model", "m")] == ["a"]
    c.apply("replicas", "DELETED", rep("b", model="x"), 8)
    assert c.index(Replica, "model", "x") == [] and c.get(Replica, "b") is None


def test_assumed_object_survives_older_events_and_yields_to_newer():
    c = Cache()
    c.apply("replicas", "ADDED", rep("a", rv=5), 5)
    c.assume(rep("a", rv=9, phase="Ready"))                 # our update, written at 9
    changed, _ = c.apply("replicas", "MODIFIED", rep("a", rv=7, phase="Failed"), 7)   # older than our write
    assert changed                                           # handlers still hear of it
    assert c.get(Replica, "a").status.phase == "Ready"
    c.apply("replicas", "MODIFIED", rep("a", rv=10, phase="Starting"), 10)
    assert c.get(Replica, "a").status.phase == "Starting"
    c.assume(rep("a", rv=3, phase="Pending"))                # stale: a newer one is cached
    assert c.get(Replica, "a").status.phase == "Starting"


def test_assumed_delete_hides_stale_events_but_reports_the_delete():
    c = Cache()
    c.apply("replicas", "ADDED", rep("a", rv=5), 5)
    c.assume_deleted("replicas", "a")
    assert c.apply("replicas", "MODIFIED", rep("a", rv=6), 6) == (False, None)
    assert c.get(Replica, "a") is None
    assert c.apply("replicas", "DELETED", rep("a", rv=7), 7)[0] is True


def at(obj, revision):
    return obj.at_revision(revision)


def test_a_create_assumed_after_the_watch_saw_a_later_status_write_keeps_the_later():
    # The agent moved the shard's status at 7 (the spec, so resourceVersion, still 5)
    # and the watch delivered that before our create call returned.
    c = Cache()
    c.apply("replicas", "ADDED", at(rep("a", rv=5), 5), 5)
    c.apply("replicas", "MODIFIED", at(rep("a", rv=5, phase="Ready"), 7), 7)
    c.assume(at(rep("a", rv=5), 5))
    assert c.get(Replica, "a").status.phase == "Ready"


def test_a_status_write_is_ordered_by_its_own_revision_not_the_spec_s():
    c = Cache()
    c.apply("replicas", "ADDED", at(rep("a", rv=5), 5), 5)
    c.assume(at(rep("a", rv=5, phase="Starting"), 9))        # our patch_status, written at 9
    c.apply("replicas", "MODIFIED", at(rep("a", rv=5, phase="Failed"), 8), 8)
    assert c.get(Replica, "a").status.phase == "Starting"
    # the event of the write itself is what the store holds: it replaces the assumed copy
    c.apply("replicas", "MODIFIED", at(rep("a", rv=5, phase="Ready"), 9), 9)
    assert c.get(Replica, "a").status.phase == "Ready"
    c.assume(at(rep("a", rv=5, phase="Starting"), 9))        # a copy of that write, late: ignored
    assert c.get(Replica, "a").status.phase == "Ready"


def test_a_relisted_object_at_or_after_an_assumed_write_replaces_it():
    # The informer puts a relist's changes (llmgw.reflector's diff) in at the list's revision.
    c = Cache()
    c.assume(at(rep("a", rv=5, phase="Starting"), 9))
    c.apply("replicas", "MODIFIED", at(rep("a", rv=5, phase="Pending"), 4), 8)   # listed before our write
    assert c.get(Replica, "a").status.phase == "Starting"
    c.apply("replicas", "MODIFIED", at(rep("a", rv=5, phase="Ready"), 10), 10)
    assert c.get(Replica, "a").status.phase == "Ready"


def test_an_assume_that_changes_the_entry_is_reported_like_an_event():
    heard = []
    c = Cache(on_assume=lambda kind, type, obj: heard.append((kind, type, obj.metadata.name, obj.revision)))
    c.assume(rep("a", rv=5))
    c.assume(rep("a", rv=6, phase="Ready"))
    c.apply("replicas", "MODIFIED", rep("a", rv=9), 9)      # the watch is ahead of the next answer
    c.assume(rep("a", rv=7))                                 # older than what the cache has: no news
    assert heard == [("replicas", "ADDED", "a", 5), ("replicas", "MODIFIED", "a", 6)]


def test_a_kind_is_named_by_its_class_or_its_plural():
    c = Cache(indexes=(REPLICAS_BY_NODE,))
    c.apply("replicas", "ADDED", rep("a", nodes=("n1",)), 5)
    a = c.get(Replica, "a")
    assert a is not None and c.get(Replica, "a") is a
    assert c.list(Replica) == [a] and c.index(Replica, "node", "n1") == [a]
    c.assume_deleted(Replica, "a")
    assert c.get(Replica, "a") is None and c.index(Replica, "node", "n1") == []


def test_an_index_nobody_registered_is_named_in_the_error():
    c = Cache(indexes=(REPLICAS_BY_NODE,))
    with pytest.raises(KeyError, match="replicas/model"):
        c.index(Replica, "model", "m")


def test_one_name_cannot_stand_for_two_indexes():
    Cache(indexes=(REPLICAS_BY_NODE, REPLICAS_BY_NODE))      # named twice: registered once
    other = Index(Replica, "node", lambda r: [r.spec.model])
    with pytest.raises(ValueError, match="replicas/node"):
        Cache(indexes=(REPLICAS_BY_NODE, other))

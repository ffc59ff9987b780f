"""Decoded objects share one fields set per model shape (llmgw/api/compact.py, issue 34)."""
from __future__ import annotations

import tracemalloc

from llmgw.api import Node
from llmgw.api.compact import share_fields_set_of, share_fields_sets
from llmgw.api.manifests import parse_stored
from llmgw.hollow import make_node


def _docs(i: int, node: Node | None = None) -> tuple[bytes, bytes]:
    node = node or make_node(f"node-{i}", i, gpus=8, fabric="fab-a")
    return node.model_dump_json(exclude={"status"}).encode(), node.status.model_dump_json().encode()


def _decoded(i: int, node: Node | None = None) -> Node:
    obj = parse_stored(*_docs(i, node))
    assert isinstance(obj, Node)
    return obj


def _again(obj: Node) -> Node:
    """The same stored documents decoded anew (a second make_node may carry another second in
    its condition's lastTransitionTime)."""
    again = parse_stored(obj.model_dump_json(exclude={"status"}).encode(), obj.status.model_dump_json().encode())
    assert isinstance(again, Node)
    return again


def test_models_of_one_shape_share_one_set_and_stay_equal() -> None:
    a, b = _decoded(1), _decoded(2)
    fresh = _again(a)
    before = a.model_dump_json()
    share_fields_sets(a)
    share_fields_sets(b)
    assert a.status.gpus[0].__pydantic_fields_set__ is b.status.gpus[7].__pydantic_fields_set__
    assert a.metadata.__pydantic_fields_set__ is b.metadata.__pydantic_fields_set__
    assert a.__pydantic_fields_set__ is b.__pydantic_fields_set__
    assert a.model_dump_json() == before
    assert a == fresh and a != b


def test_a_copy_has_its_own_set_unless_told_to_share() -> None:
    a = _decoded(1)
    share_fields_sets(a)
    deep = a.model_copy(deep=True)
    deep.status.gpus[0].name = "changed"
    assert a.status.gpus[0].name != "changed"
    assert deep.status.gpus[0].__pydantic_fields_set__ is not a.status.gpus[0].__pydantic_fields_set__
    shallow = share_fields_set_of(a.model_copy(update={"status": a.status}), a)
    assert shallow.__pydantic_fields_set__ is a.__pydantic_fields_set__ and shallow == a


def test_a_fleet_of_nodes_takes_less_than_half_the_memory() -> None:
    docs = [_docs(i) for i in range(200)]

    def held(share: bool) -> int:
        tracemalloc.start()
        try:
            nodes = [parse_stored(*d) for d in docs]
            if share:
                for n in nodes:
                    share_fields_sets(n)
            return tracemalloc.get_traced_memory()[0]
        finally:
            tracemalloc.stop()

    assert held(True) < 0.6 * held(False)


def test_nodes_share_the_engines_adapters_and_port_range_they_list_alike() -> None:
    a, b = _decoded(1), _decoded(2)
    other = make_node("node-3", 3, gpus=8, fabric="fab-a", engines=("sim",))
    other.status.engines[0].version = "2.0"
    c = _decoded(3, other)
    fresh = _again(a)
    before = [n.model_dump_json() for n in (a, b, c)]
    for n in (a, b, c):
        share_fields_sets(n)
    assert all(x is y for x, y in zip(a.status.engines, b.status.engines, strict=True))
    assert a.status.fabrics[0].adapters[0] is b.status.fabrics[0].adapters[0]
    assert a.status.portRange is b.status.portRange
    assert c.status.engines[0] is not a.status.engines[0] and c.status.engines[0].version == "2.0"
    assert a.status.gpus[0] is not b.status.gpus[0]     # a GPU has its own uuid: not shared
    assert [n.model_dump_json() for n in (a, b, c)] == before and a == fresh

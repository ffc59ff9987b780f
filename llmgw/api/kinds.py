"""A kind as its class: the word a person typed (`kind_named`), and an object taken as its kind,
for code that holds an object whose kind it knows by other means.

A REST reply to "get nodes/n1" is a Node; the type checker sees only an object. `of_kind`
says which kind it is, and refuses (TypeError) an object of another kind: a bug, not input.
"""
from __future__ import annotations

from collections.abc import Iterable

from llmgw.api.types import KINDS, AnyObject, ObjectT, resolve_kind


def kind_named(word: str) -> type[AnyObject]:
    """The kind of a singular, plural, short or Kind-cased word (`no`, `Node`, `nodes`);
    ValueError naming the words there are."""
    return KINDS[resolve_kind(word)]


def of_kind(kind: type[ObjectT], obj: AnyObject) -> ObjectT:
    if not isinstance(obj, kind):
        raise TypeError(f"expected a {kind.__name__}, got a {type(obj).__name__} ({obj.name})")
    return obj


def all_of_kind(kind: type[ObjectT], objects: Iterable[AnyObject]) -> list[ObjectT]:
    return [of_kind(kind, o) for o in objects]

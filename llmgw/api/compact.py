"""Decoded objects made smaller: one shared "fields set" per shape instead of one per model.

pydantic gives every model instance its own ``__pydantic_fields_set__`` (the fields the
input named), a set of up to ~20 names: 216 bytes for four fields, about 730 for five or
more. A stored document names every field, so those sets are all alike, and a Node of 8
GPUs carries ~20 of them: 10.7 of its 19.5 KB as a decoded object (2 KB as JSON). A
controller-manager holds every Node, Replica and Shard of the fleet (issue 34), so each
decoded object's models get the one set of their class and fields instead.

Nothing in llmgw reads the fields set (no ``exclude_unset``, no ``model_fields_set``);
pydantic's ``model_copy`` copies it, so a copy has its own again. An attribute assigned on
a shared object adds its name to the shared set, which changes nothing anyone reads.
"""
from __future__ import annotations

from typing import TypeVar

from pydantic import BaseModel

ModelT = TypeVar("ModelT", bound=BaseModel)

# (class, field names) -> the one set of them; bounded by the classes and their field subsets
_SHARED: dict[tuple[type[BaseModel], frozenset[str]], set[str]] = {}


def share_fields_sets(model: BaseModel) -> None:
    """Give `model` and the models inside it (fields, list items) the shared fields set of their shape."""
    fields = model.__pydantic_fields_set__
    key = (type(model), frozenset(fields))
    shared = _SHARED.get(key)
    if shared is None:
        shared = _SHARED.setdefault(key, set(key[1]))
    object.__setattr__(model, "__pydantic_fields_set__", shared)
    for value in model.__dict__.values():
        if isinstance(value, BaseModel):
            share_fields_sets(value)
        elif type(value) is list:
            for item in value:
                if isinstance(item, BaseModel):
                    share_fields_sets(item)


def share_fields_set_of(copy: ModelT, original: BaseModel) -> ModelT:
    """`copy` (a ``model_copy`` of `original` with some fields replaced) with `original`'s fields
    set again instead of its own copy of it; returns `copy`."""
    object.__setattr__(copy, "__pydantic_fields_set__", original.__pydantic_fields_set__)
    return copy

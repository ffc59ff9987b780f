"""Decoded objects made smaller: one shared "fields set" per shape, and one instance of each
small value that many objects hold alike.

pydantic gives every model instance its own ``__pydantic_fields_set__`` (the fields the
input named), a set of up to ~20 names: 216 bytes for four fields, about 730 for five or
more. A stored document names every field, so those sets are all alike, and a Node of 8
GPUs carries ~20 of them: 10.7 of its 19.5 KB as a decoded object (2 KB as JSON). A
controller-manager holds every Node, Replica and Shard of the fleet (issue 34), so each
decoded object's models get the one set of their class and fields instead.

Nothing in llmgw reads the fields set (no ``exclude_unset``, no ``model_fields_set``);
pydantic's ``model_copy`` copies it, so a copy has its own again. An attribute assigned on
a shared object adds its name to the shared set, which changes nothing anyone reads.

Some models hold only strings, numbers and None, and a fleet repeats them: every Node lists
the same engines, adapters and port range (1.6 of a Node's 8.5 KB). Those classes
(``INTERNED``) are shared too: a decoded object refers to one instance per value. No code
changes such a model in place (it would change every object holding it); a changed value
is a new instance, as everywhere in llmgw. (An owner reference, alike across a model's
replicas, is unique to each shard: kept per object, the table would cost what it saves.)
"""
from __future__ import annotations

from typing import Any, TypeVar

from pydantic import BaseModel

from llmgw.api.types import Adapter, EngineInfo, PortRange

ModelT = TypeVar("ModelT", bound=BaseModel)

# (class, field names) -> the one set of them; bounded by the classes and their field subsets
_SHARED: dict[tuple[type[BaseModel], frozenset[str]], set[str]] = {}

INTERNED: frozenset[type[BaseModel]] = frozenset({EngineInfo, Adapter, PortRange})
_INTERNS: dict[tuple[Any, ...], BaseModel] = {}
_INTERNS_LIMIT = 10_000   # distinct values kept (a fleet has a few); past it the table starts again


def _interned(value: BaseModel) -> BaseModel:
    key = (type(value), *value.__dict__.values())
    found = _INTERNS.get(key)
    if found is None:
        if len(_INTERNS) >= _INTERNS_LIMIT:
            _INTERNS.clear()
        found = _INTERNS[key] = value
    return found


def share_fields_sets(model: BaseModel) -> None:
    """Give `model` and the models inside it (fields, list items) the shared fields set of their
    shape, and the shared instance of each ``INTERNED`` value."""
    fields = model.__pydantic_fields_set__
    key = (type(model), frozenset(fields))
    shared = _SHARED.get(key)
    if shared is None:
        shared = _SHARED.setdefault(key, set(key[1]))
    object.__setattr__(model, "__pydantic_fields_set__", shared)
    attrs = model.__dict__
    for name, value in attrs.items():
        if isinstance(value, BaseModel):
            attrs[name] = _compacted(value)
        elif type(value) is list:
            for i, item in enumerate(value):
                if isinstance(item, BaseModel):
                    value[i] = _compacted(item)


def _compacted(model: BaseModel) -> BaseModel:
    """A model inside another: the shared instance of its value when its class is ``INTERNED``,
    with the shared fields sets."""
    if type(model) in INTERNED:
        model = _interned(model)
    share_fields_sets(model)
    return model


def share_fields_set_of(copy: ModelT, original: BaseModel) -> ModelT:
    """`copy` (a ``model_copy`` of `original` with some fields replaced) with `original`'s fields
    set again instead of its own copy of it; returns `copy`."""
    object.__setattr__(copy, "__pydantic_fields_set__", original.__pydantic_fields_set__)
    return copy

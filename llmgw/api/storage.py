"""Storage versions: stored objects that outlive their schema (docs/contracts.md, "Storage versions").

Every stored object carries the version of the schema that wrote it, its ``apiVersion``. When a
kind's stored form changes (a field renamed or removed), the kind's class moves to a new
apiVersion and one small function, registered here by name, converts a document of the version
before it; a reader applies them in turn (``convert``) to whatever version it finds stored. A
converted object is written back in the current version only when it changes, or by
``llmgw ctl migrate-storage``, which rewrites every object still stored in an older version.

A field removed from the API stays known for one deprecation period (``removed_field``): a
document that still sets it is refused (``removed_problems``) with a line naming what replaces it,
rather than as an unknown field.

    @conversion("Model", "llmgw.io/v1alpha1", "llmgw.io/v1")
    def replica_count_renamed(doc): ...        # the document of the old version, a new one back

    removed_field("Model", "spec.replicaCount", "spec.replicas", "0.3.0")
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from llmgw.api.types import KIND_BY_NAME

Doc = dict[str, Any]
Convert = Callable[[Doc], Doc]


@dataclass(frozen=True)
class Conversion:
    name: str
    to_version: str
    fn: Convert


@dataclass(frozen=True)
class Removed:
    replacement: str
    since: str   # the llmgw release that removed it


# (kind, stored apiVersion) -> the conversion to the next version
CONVERSIONS: dict[tuple[str, str], Conversion] = {}
# kind -> {field path -> what replaces it}
REMOVED: dict[str, dict[str, Removed]] = {}


def current_version(kind: str) -> str:
    """The apiVersion `kind` (a Kind name: Model) is stored in now: its class's."""
    default: str = KIND_BY_NAME[kind].model_fields["apiVersion"].default
    return default


def conversion(kind: str, from_version: str, to_version: str) -> Callable[[Convert], Convert]:
    """Register the decorated function as the conversion of `kind`'s stored documents from
    `from_version` to `to_version`: it takes the document (apiVersion, kind, metadata, spec and,
    where one is stored, status) and returns the new one; its apiVersion is set for it."""
    def register(fn: Convert) -> Convert:
        CONVERSIONS[(kind, from_version)] = Conversion(fn.__name__, to_version, fn)
        return fn
    return register


def removed_field(kind: str, path: str, replacement: str, since: str) -> None:
    """`path` (dotted, through mappings: spec.replicaCount) of `kind` was removed in llmgw `since`:
    `replacement` says what to set instead."""
    REMOVED.setdefault(kind, {})[path] = Removed(replacement, since)


def stale(doc: Doc) -> bool:
    """Whether a stored document is of an older version than its kind's current one."""
    kind = doc.get("kind")
    return kind in KIND_BY_NAME and doc.get("apiVersion") != current_version(kind)


def convert(doc: Doc) -> Doc:
    """`doc` in its kind's current version, through the registered conversions in turn; `doc`
    itself when it is current already, or of a kind or version no conversion knows (the object's
    validation then says what is wrong with it)."""
    kind = doc.get("kind")
    if not isinstance(kind, str) or kind not in KIND_BY_NAME:
        return doc
    target = current_version(kind)
    seen = set()
    while doc.get("apiVersion") != target:
        version = doc.get("apiVersion")
        step = CONVERSIONS.get((kind, version)) if isinstance(version, str) else None
        if step is None or version in seen:
            return doc
        seen.add(version)
        doc = {**step.fn(doc), "apiVersion": step.to_version}
    return doc


def removed_problems(doc: Doc) -> list[str]:
    """One line for each field `doc` sets that its kind removed, naming what replaces it."""
    kind = doc.get("kind")
    problems = []
    for path, removed in REMOVED.get(kind, {}).items() if isinstance(kind, str) else ():
        node: Any = doc
        for part in path.split("."):
            node = node.get(part) if isinstance(node, dict) else None
        if node is not None:
            problems.append(f"{path}: removed in llmgw {removed.since}; use {removed.replacement}")
    return problems

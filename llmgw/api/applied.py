"""What applying a manifest makes of a live object: `llmgw apply` (the server's apply), and a GitSource.

An apply owns the spec and the labels and annotations the manifest names: the spec is
replaced, those labels and annotations are set, and the ones the manifest does not name
(added by controllers or agents) are kept. Status is never applied, so a controller's
fields (a Model's status.desiredReplicas, the autoscaler's count) are never a difference.

An object a GitSource applied (its label llmgw.io/gitsource) belongs to that source's
repository: an apply of it by hand is refused (OwnedByGitSource), never fought over by the
source reverting it. A manifest that carries the same label applies as the source would.
"""
from __future__ import annotations

from typing import Any

from llmgw.api.errors import Conflict
from llmgw.api.limits import path_text
from llmgw.api.types import AnyObject, ObjectT
from llmgw.api.wellknown import GITSOURCE_LABEL


class OwnedByGitSource(Conflict):
    """An apply of an object a GitSource holds, by a manifest that does not carry its label."""

    reason = "OwnedByGitSource"


def check_not_owned(live: AnyObject, manifest: AnyObject) -> None:
    """OwnedByGitSource when `live` carries a GitSource's label that `manifest` does not."""
    owner = live.metadata.labels.get(GITSOURCE_LABEL)
    if owner is not None and manifest.metadata.labels.get(GITSOURCE_LABEL) != owner:
        raise OwnedByGitSource(
            f"{live.kind.lower()}/{live.name} is applied by GitSource {owner} (label {GITSOURCE_LABEL}={owner}): "
            f"change it in that source's repository, or `llmgw suspend gitsource {owner}` first; "
            "an apply by hand would be reverted at the source's next sync")


def applied(live: ObjectT, manifest: AnyObject) -> ObjectT:
    """A copy of `live` with what `manifest` applies (applies_nothing says first whether it would differ)."""
    desired = live.model_copy(deep=True)
    desired.spec = manifest.spec.model_copy(deep=True)
    desired.metadata.labels = {**live.metadata.labels, **manifest.metadata.labels}
    desired.metadata.annotations = {**live.metadata.annotations, **manifest.metadata.annotations}
    return desired


def applies_nothing(live: AnyObject, manifest: AnyObject) -> bool:
    """True when applying `manifest` leaves `live` as it is: the same spec, and every label and annotation
    the manifest names already set. No copy is made (a GitSource asks this of 2,000 objects a sync)."""
    md, lmd = manifest.metadata, live.metadata
    return (live.spec == manifest.spec and all(lmd.labels.get(k) == v for k, v in md.labels.items())
            and all(lmd.annotations.get(k) == v for k, v in md.annotations.items()))


def changed_fields(live: AnyObject, desired: AnyObject) -> list[str]:
    """The paths (`spec.replicas`, `metadata.labels.team`) at which applying `desired` changes `live`."""
    def view(obj: AnyObject) -> dict[str, Any]:
        return {"metadata": {"labels": obj.metadata.labels, "annotations": obj.metadata.annotations},
                "spec": obj.spec.model_dump(mode="json", exclude_none=True)}
    out: list[str] = []
    _diff(view(live), view(desired), [], out)
    return out


def _diff(a: Any, b: Any, at: list[Any], out: list[str]) -> None:
    if isinstance(a, dict) and isinstance(b, dict):
        for k in sorted(set(a) | set(b), key=str):
            _diff(a.get(k), b.get(k), [*at, k], out)
    elif isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            _diff(x, y, [*at, i], out)
    elif a != b:
        out.append(path_text(at))

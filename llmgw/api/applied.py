"""What applying a manifest makes of a live object: `llmgw apply` (the server's apply), and a GitSource.

An apply owns the spec and the labels and annotations the manifest names: the spec is
replaced, those labels and annotations are set, and the ones the manifest does not name
(added by controllers or agents) are kept. Status is never applied, so a controller's
fields (a Model's status.desiredReplicas, the autoscaler's count) are never a difference.
"""
from __future__ import annotations

from typing import Any

from llmgw.api.limits import path_text
from llmgw.api.types import AnyObject, ObjectT


def applied(live: ObjectT, manifest: AnyObject) -> ObjectT:
    """A copy of `live` with what `manifest` applies; compare it with `live` to know whether to write."""
    desired = live.model_copy(deep=True)
    desired.spec = manifest.spec.model_copy(deep=True)
    desired.metadata.labels = {**live.metadata.labels, **manifest.metadata.labels}
    desired.metadata.annotations = {**live.metadata.annotations, **manifest.metadata.annotations}
    return desired


def unchanged(live: AnyObject, desired: AnyObject) -> bool:
    return (live.spec, live.metadata.labels, live.metadata.annotations) == (
        desired.spec, desired.metadata.labels, desired.metadata.annotations)


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

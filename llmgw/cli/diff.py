"""What `llmgw apply` owns of an object, and the diff of it that `llmgw diff` prints."""
from __future__ import annotations

import difflib
from typing import Any

from llmgw.api import AnyObject
from llmgw.printers.objects import dump_yaml, ref, to_dict


def applied_view(obj: AnyObject | None, onto: AnyObject | None = None) -> dict[str, Any]:
    """What `apply` owns: spec, and the labels and annotations a manifest sets.

    With `onto` (the live object), labels and annotations are merged onto the live ones as
    the server's apply does: keys the manifest does not mention (added by controllers or
    agents) are kept, so they are no difference.
    """
    if obj is None:
        return {}
    d = to_dict(obj)
    labels, annotations = d["metadata"].get("labels", {}), d["metadata"].get("annotations", {})
    if onto is not None:
        labels = {**onto.metadata.labels, **labels}
        annotations = {**onto.metadata.annotations, **annotations}
    return {"metadata": {"labels": labels, "annotations": annotations}, "spec": d.get("spec", {})}


def unified_diff(live: AnyObject | None, desired: AnyObject) -> str:
    """Unified diff of labels/annotations/spec, live -> after applying the manifest; '' when equal."""
    a, b = applied_view(live), applied_view(desired, onto=live)
    if a == b:
        return ""
    name = ref(desired)
    a_lines = dump_yaml(a, sort_keys=True).splitlines(keepends=True) if live is not None else []
    b_lines = dump_yaml(b, sort_keys=True).splitlines(keepends=True)
    return "".join(difflib.unified_diff(
        a_lines, b_lines, fromfile=f"live/{name}" if live is not None else "/dev/null",
        tofile=f"manifest/{name}"))

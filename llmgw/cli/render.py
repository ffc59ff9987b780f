"""Output formats (yaml, json, name), `describe` text and the manifest diff."""
from __future__ import annotations

import difflib
import json
from datetime import datetime, timezone
from typing import Any, Sequence

import yaml

from llmgw.api import API_VERSION, Object
from llmgw.cli.tables import NONE, format_table, human_age

OUTPUTS = ("table", "wide", "yaml", "json", "name")


def singular(obj: Object) -> str:
    return obj.kind.lower()


def ref(obj: Object) -> str:
    """`model/llama`: the name a person types back into the CLI."""
    return f"{singular(obj)}/{obj.name}"


def to_dict(obj: Object) -> dict[str, Any]:
    return obj.model_dump(mode="json", exclude_none=True)


def _yaml(data: Any) -> str:
    return yaml.safe_dump(data, sort_keys=False, default_flow_style=False)


def format_objects(objects: Sequence[Object], output: str, single: bool) -> str:
    """yaml/json/name of one object (single) or a List of them."""
    if output == "name":
        return "\n".join(ref(o) for o in objects)
    if single:
        data: Any = to_dict(objects[0])
    else:
        data = {"apiVersion": API_VERSION, "kind": "List", "items": [to_dict(o) for o in objects]}
    if output == "json":
        return json.dumps(data, indent=2)
    return _yaml(data).rstrip("\n")


# ------------------------------------------------------------------ describe

def _labels(d: dict[str, str]) -> list[str]:
    return [f"{k}={v}" for k, v in sorted(d.items())] or [NONE]


def _section(title: str, data: Any) -> list[str]:
    if data in (None, {}, []):
        return [f"{title}:", f"  {NONE}"]
    body = _yaml(data).rstrip("\n").splitlines()
    return [f"{title}:", *(f"  {line}" for line in body)]


def _when(ts: Any, now: datetime) -> str:
    if isinstance(ts, str):
        try:
            ts = datetime.fromisoformat(ts.replace("Z", "+00:00"))
        except ValueError:
            return ts
    if isinstance(ts, datetime):
        if ts.tzinfo is None:
            ts = ts.replace(tzinfo=timezone.utc)
        return human_age(ts, now)
    return NONE


def describe(obj: Object, events: Sequence[dict[str, Any]] = (), extra: Sequence[str] = (),
             now: datetime | None = None) -> str:
    """Name, labels, spec and status as YAML, conditions and recent events as tables."""
    now = now or datetime.now(timezone.utc)
    md = obj.metadata
    head = [
        ("Name", [md.name]), ("Kind", [obj.kind]), ("Labels", _labels(md.labels)),
        ("Annotations", _labels(md.annotations)),
        ("Created", [f"{md.creationTimestamp.isoformat() if md.creationTimestamp else NONE}"
                     f" ({human_age(md.creationTimestamp, now)} ago)"]),
        ("Generation", [str(md.generation)]),
        ("Owners", [f"{o.kind.lower()}/{o.name}" for o in md.ownerReferences] or [NONE]),
    ]
    if md.finalizers:
        head.append(("Finalizers", list(md.finalizers)))
    if md.deletionTimestamp:
        head.append(("Deleting since", [md.deletionTimestamp.isoformat()]))
    lines = []
    for title, values in head:
        lines.append(f"{title + ':':<14}{values[0]}")
        lines.extend(f"{'':<14}{v}" for v in values[1:])
    lines += _section("Spec", obj.model_dump(mode="json", exclude_none=True)["spec"])
    status = obj.model_dump(mode="json", exclude_none=True).get("status", {})
    conditions = status.pop("conditions", [])
    lines += _section("Status", status)
    lines.append("Conditions:")
    if conditions:
        rows = [[c["type"], c["status"], c.get("reason") or NONE, _when(c.get("lastTransitionTime"), now),
                 c.get("message") or ""] for c in conditions]
        lines += ["  " + line for line in format_table(["TYPE", "STATUS", "REASON", "AGE", "MESSAGE"],
                                                       rows).splitlines()]
    else:
        lines.append(f"  {NONE}")
    lines += list(extra)
    lines.append("Events:")
    if events:
        rows = [[str(e.get("type", "")), str(e.get("reason", "")),
                 _when(e.get("lastTimestamp") or e.get("timestamp") or e.get("time"), now),
                 str(e.get("message", ""))] for e in events]
        lines += ["  " + line for line in format_table(["TYPE", "REASON", "AGE", "MESSAGE"], rows).splitlines()]
    else:
        lines.append(f"  {NONE}")
    return "\n".join(lines)


# ---------------------------------------------------------------------- diff

def applied_view(obj: Object | None, onto: Object | None = None) -> dict[str, Any]:
    """What `apply` owns: spec, and the labels and annotations a manifest sets.

    With `onto` (the live object), labels and annotations are merged onto the live ones as
    the server's apply does: keys the manifest does not mention (added by controllers or
    agents) are kept, so they are no difference.
    """
    if obj is None:
        return {}
    d = obj.model_dump(mode="json", exclude_none=True)
    labels, annotations = d["metadata"].get("labels", {}), d["metadata"].get("annotations", {})
    if onto is not None:
        labels = {**onto.metadata.labels, **labels}
        annotations = {**onto.metadata.annotations, **annotations}
    return {"metadata": {"labels": labels, "annotations": annotations}, "spec": d.get("spec", {})}


def unified_diff(live: Object | None, desired: Object) -> str:
    """Unified diff of labels/annotations/spec, live -> after applying the manifest; '' when equal."""
    a, b = applied_view(live), applied_view(desired, onto=live)
    if a == b:
        return ""
    name = ref(desired)
    a_lines = yaml.safe_dump(a, sort_keys=True).splitlines(keepends=True) if live is not None else []
    b_lines = yaml.safe_dump(b, sort_keys=True).splitlines(keepends=True)
    return "".join(difflib.unified_diff(
        a_lines, b_lines, fromfile=f"live/{name}" if live is not None else "/dev/null",
        tofile=f"manifest/{name}"))

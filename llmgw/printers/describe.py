"""`llmgw describe`'s text: metadata, spec and status as YAML, conditions and events as tables."""
from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timezone
from typing import Any

from llmgw.api import AnyObject
from llmgw.printers.objects import dump_yaml, to_dict
from llmgw.printers.table import NONE, age_of, human_age, section


def _labels(d: dict[str, str]) -> list[str]:
    return [f"{k}={v}" for k, v in sorted(d.items())] or [NONE]


def _yaml_section(title: str, data: Any) -> list[str]:
    if data in (None, {}, []):
        return [f"{title}:", f"  {NONE}"]
    body = dump_yaml(data).rstrip("\n").splitlines()
    return [f"{title}:", *(f"  {line}" for line in body)]


def describe(obj: AnyObject, events: Sequence[dict[str, Any]] = (), extra: Sequence[str] = (),
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
    lines: list[str] = []
    for title, values in head:
        lines.append(f"{title + ':':<14}{values[0]}")
        lines.extend(f"{'':<14}{v}" for v in values[1:])
    data = to_dict(obj)
    lines += _yaml_section("Spec", data["spec"])
    status = data.get("status", {})
    conditions = status.pop("conditions", [])
    inventory = status.pop("inventory", None)    # a GitSource's: a table, not a YAML list
    lines += _yaml_section("Status", status)
    if inventory is not None:
        lines += section(f"Inventory ({len(inventory)})", ["KIND", "NAME"],
                         [[e["kind"], e["name"]] for e in inventory])
    lines += section("Conditions", ["TYPE", "STATUS", "REASON", "AGE", "MESSAGE"], [
        [c["type"], c["status"], c.get("reason") or NONE, age_of(c.get("lastTransitionTime"), now),
         c.get("message") or ""] for c in conditions])
    lines += extra
    lines += section("Events", ["TYPE", "REASON", "AGE", "MESSAGE"], [
        [str(e.get("type", "")), str(e.get("reason", "")),
         age_of(e.get("lastTimestamp") or e.get("timestamp") or e.get("time"), now),
         str(e.get("message", ""))] for e in events])
    return "\n".join(lines)

"""Objects as yaml, json or `kind/name`: `get -o`, and the objects a watch (`get -w -o`) prints."""
from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import yaml

from llmgw.api import AnyObject
from llmgw.api.meta import API_VERSION

OUTPUTS = ("yaml", "json", "name")   # besides the tables (default and "wide")


def ref(obj: AnyObject) -> str:
    """`model/llama`: the name a person types back into the CLI."""
    return f"{obj.kind.lower()}/{obj.name}"


def to_dict(obj: AnyObject) -> dict[str, Any]:
    return obj.model_dump(mode="json", exclude_none=True)


def dump_yaml(data: Any, sort_keys: bool = False) -> str:
    return yaml.safe_dump(data, sort_keys=sort_keys, default_flow_style=False)


def format_objects(objects: Sequence[AnyObject], output: str, single: bool) -> str:
    """yaml/json/name of one object (single) or a List of them."""
    if output == "name":
        return "\n".join(ref(o) for o in objects)
    if single:
        data: Any = to_dict(objects[0])
    else:
        data = {"apiVersion": API_VERSION, "kind": "List", "items": [to_dict(o) for o in objects]}
    if output == "json":
        return json.dumps(data, indent=2)
    return dump_yaml(data).rstrip("\n")


def format_event(obj: AnyObject, output: str) -> str:
    """One changed object of a watch: its name, one line of json, or a yaml document."""
    if output == "name":
        return ref(obj)
    if output == "json":
        return json.dumps(to_dict(obj))
    return "---\n" + format_objects([obj], "yaml", single=True)

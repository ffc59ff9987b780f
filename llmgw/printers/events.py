"""Events as `llmgw events` prints them: kubectl's columns (LAST SEEN, TYPE, REASON, OBJECT,
MESSAGE; `-o wide` adds the exact TIME and the whole message), or yaml and json."""
from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from llmgw.api import KINDS
from llmgw.printers.objects import dump_yaml
from llmgw.printers.table import age_of

Event = Mapping[str, Any]
HEADERS = ["LAST SEEN", "TYPE", "REASON", "OBJECT", "MESSAGE"]
WIDE_HEADERS = [*HEADERS, "TIME"]


def object_of(event: Event) -> str:
    """The object an event is about as a person types it back: `replica/llama-x`."""
    kind = KINDS.get(str(event.get("kind")))
    word = str(kind.model_fields["kind"].default).lower() if kind else event.get("kind")
    return f"{word}/{event.get('name')}"


def _message(text: str, wide: bool) -> str:
    """One line: a table row is one. The first line and how many follow, or (wide) all of them."""
    first, *more = text.splitlines() or [""]
    if wide:
        return " | ".join([first, *more])
    return f"{first} (+{len(more)} lines: -o wide or yaml)" if more else first


def event_row(event: Event, now: datetime, wide: bool = False) -> list[str]:
    row = [age_of(event.get("time"), now), str(event.get("type", "")), str(event.get("reason", "")),
           object_of(event), _message(str(event.get("message", "")), wide)]
    return [*row, str(event.get("time", ""))] if wide else row


def format_events(events: Sequence[Event], output: str) -> str:
    """A List of events as yaml or json."""
    data = {"kind": "EventList", "items": [dict(e) for e in events]}
    return json.dumps(data, indent=2) if output == "json" else dump_yaml(data).rstrip("\n")


def format_event(event: Event, output: str) -> str:
    """One event of a watch: a line of json, or a yaml document."""
    return json.dumps(dict(event)) if output == "json" else "---\n" + dump_yaml(dict(event)).rstrip("\n")

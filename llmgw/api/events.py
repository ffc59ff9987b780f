"""Events as the API shows them (`GET /events`, `llmgw events`, `llmgw describe`): one dict each,
{"kind", "name", "id", "type", "reason", "message", "time"}: the object it is about (its plural
kind and name), its id (a nanosecond timestamp, unique under that object), and what it says."""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

EVENT_TYPES = ("Normal", "Warning")


def event_key(event: Mapping[str, Any]) -> str:
    """Where an event is filed, `<kind>/<name>/<id>`: unique, as a watch's key."""
    return f"{event['kind']}/{event['name']}/{event['id']}"

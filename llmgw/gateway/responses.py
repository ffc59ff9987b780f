"""The Responses API's state: which replica holds each stored response.

An engine keeps a response made with `store` in its own memory, so a follow-up naming it
(`previous_response_id`) must reach that replica: anywhere else the engine answers 404. The
gateway remembers the replica of every response id it relays (from the response's body, or a
stream's `response.created` event, the first), in a bounded map (the oldest forgotten first),
and sends a follow-up there (steps/endpoint.py, proxy.py). docs/contracts.md, "Responses API
affinity".
"""
from __future__ import annotations

import re
from collections import OrderedDict

DEFAULT_SIZE = 100_000   # ids remembered: about 150 bytes each
# A response object's id (vLLM: "resp_" and a uuid) is the first "id" of its body and of a
# stream's first event; the ids of its output items ("msg_...") come after it.
_ID = re.compile(rb'"id"\s*:\s*"(resp[^"\\]{1,200})"')


class ResponseHomes:
    def __init__(self, size: int = DEFAULT_SIZE) -> None:
        self.size = size
        self._homes: OrderedDict[str, str] = OrderedDict()   # response id -> replica

    def record(self, data: bytes, replica: str) -> bool:
        """Remember the replica of the response whose body (or first events) is `data`; whether
        `data` held its id."""
        m = _ID.search(data)
        if m is None:
            return False
        homes, response_id = self._homes, m.group(1).decode()
        homes[response_id] = replica
        homes.move_to_end(response_id)
        if len(homes) > self.size:
            homes.popitem(last=False)
        return True

    def home(self, response_id: str) -> str | None:
        """The replica that made the response, if this gateway relayed it and still remembers it."""
        return self._homes.get(response_id)

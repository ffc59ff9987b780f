"""The Responses API's state: which replica holds a stored response, carried in its id.

An engine keeps a response made with `store` in its own memory, so a follow-up naming it
(`previous_response_id`, or `GET`/cancel of `/v1/responses/{id}`) must reach that replica:
anywhere else the engine answers 404. The gateway stores nothing for it: the id it hands the
client names the replica. The engine's id (`resp_...`) gets `~` and the replica's name in
base64url appended, in every response id of the body, or of each event of a stream, as it is
relayed; a follow-up's id is split back into the engine's id, sent on to the engine, and the
replica it is pinned to (steps/endpoint.py, gateway.py). So any gateway, one started since
the response was made included, routes the follow-up, with no write per response and no bound
to keep; and an id whose replica has left routing is known as such (404
`response_replica_gone`). docs/contracts.md, "Responses API affinity"; docs/architecture.md
weighs this against a map shared through etcd.
"""
from __future__ import annotations

import re
from base64 import urlsafe_b64decode, urlsafe_b64encode
from collections.abc import Callable
from functools import lru_cache

_SEP, _SEP_BYTES = "~", b"~"
# A response object's id (vLLM's, SGLang's: "resp_" and a uuid), and the previous_response_id it
# echoes (made on the same replica: a follow-up is pinned there); output items' ids ("msg_...")
# are not. Replaced by a function, not a template: expanding "\g<0>..." cost 3 us more a body.
_ID = re.compile(rb'"(?:id|previous_response_id)"\s*:\s*"resp[^"\\~]{0,200}(?=")')


def home(response_id: str) -> tuple[str, str] | None:
    """(the engine's id, the replica holding it) of an id the gateway handed out; None for any other."""
    engine_id, sep, tag = response_id.rpartition(_SEP)
    if not sep or not engine_id or not tag:
        return None
    try:
        replica = urlsafe_b64decode(tag + "=" * (-len(tag) % 4)).decode()
    except ValueError:   # not base64, or not UTF-8 (UnicodeDecodeError is a ValueError)
        return None
    return (engine_id, replica) if replica else None


@lru_cache(maxsize=4096)   # a replica's, made once: not per response
def _tagger(replica: str) -> Callable[[re.Match[bytes]], bytes]:
    """re.sub's replacement: a matched id with the replica's tag after it."""
    tag = _SEP_BYTES + urlsafe_b64encode(replica.encode()).rstrip(b"=")
    return lambda m: m.group() + tag


class Relabel:
    """Rewrites the response ids in what replica `replica` answers into ids naming it: a whole
    body at once (`whole`), a stream chunk by chunk (`chunk`, then `end`), where the partial
    last line of a chunk waits for the next (an event's data line holds its response id whole;
    a stream is relayed line by line, as a client reads it)."""

    __slots__ = ("_tagged", "_rest")

    def __init__(self, replica: str) -> None:
        self._tagged = _tagger(replica)
        self._rest = b""

    def whole(self, data: bytes) -> bytes:
        return _ID.sub(self._tagged, data)

    def chunk(self, data: bytes) -> bytes:
        data = self._rest + data
        cut = data.rfind(b"\n") + 1
        self._rest = data[cut:]
        return _ID.sub(self._tagged, data[:cut]) if cut else b""

    def end(self) -> bytes:
        rest, self._rest = self._rest, b""
        return _ID.sub(self._tagged, rest)

"""What a request for an engine's log asks (`llmgw logs`): one parser for the CLI's client, the
API server and the agent, so each refuses the same bad query the same way (400, the field named).

    GET /apis/llmgw.io/v1/shards/<shard>/log?tail=N&follow=1&previous=1&command=C
    GET /apis/llmgw.io/v1/replicas/<replica>/log?rank=R&...    (the replica's shard of rank R)

Reads are bounded: the last `tail` lines, never more than the last MAX_LOG_BYTES of the file;
`follow` then streams what the engine appends until its run ends or the client goes.
"""
from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

MAX_LOG_BYTES = 1 << 20       # the most of a log one request returns before following (its end)
MAX_LOG_TAIL = 100_000        # lines
MAX_RANK = 1023
_COMMAND = re.compile(r"[a-z0-9][a-z0-9-]{0,62}")   # a rendered command's name (sim, vllm, ray-head)
_TRUE, _FALSE = ("1", "true"), ("", "0", "false")


def _flag(query: Mapping[str, str], field: str) -> bool:
    value = query.get(field, "")
    if value not in _TRUE + _FALSE:
        raise ValueError(f"{field}: must be true or false, got {value[:40]!r}")
    return value in _TRUE


def _int(query: Mapping[str, str], field: str, top: int) -> int | None:
    value = query.get(field)
    if value is None or value == "":
        return None
    if not value.isdigit() or int(value) > top:
        raise ValueError(f"{field}: must be an integer in 0..{top}, got {value[:40]!r}")
    return int(value)


@dataclass(frozen=True)
class LogQuery:
    tail: int | None = None       # the last N lines; None: as much as MAX_LOG_BYTES holds
    follow: bool = False          # then stream what is appended, until the run ends
    previous: bool = False        # the run before the latest one of this shard on its node
    command: str | None = None    # which of the shard's programs (ray-head, vllm); None: its only one

    @classmethod
    def parse(cls, query: Mapping[str, str]) -> "LogQuery":
        """From a URL's query; ValueError naming the field for a bad value."""
        command = query.get("command") or None
        if command is not None and not _COMMAND.fullmatch(command):
            raise ValueError(f"command: {command[:70]!r} is not a command's name (lower-case letters, digits, '-')")
        q = cls(tail=_int(query, "tail", MAX_LOG_TAIL), follow=_flag(query, "follow"),
                previous=_flag(query, "previous"), command=command)
        if q.follow and q.previous:
            raise ValueError("follow: the previous run has ended; there is nothing to follow")
        return q

    def params(self) -> dict[str, str]:
        """As a URL's query (what `parse` reads back)."""
        out = {"tail": None if self.tail is None else str(self.tail), "follow": "1" if self.follow else None,
               "previous": "1" if self.previous else None, "command": self.command}
        return {k: v for k, v in out.items() if v is not None}


def parse_rank(query: Mapping[str, str]) -> int:
    """?rank= of a replica's log (0 when absent)."""
    rank = _int(query, "rank", MAX_RANK)
    return 0 if rank is None else rank

"""A toy routing policy, written as a new one is (docs/architecture.md, "Adding a routing policy"):
one module that defines a class and registers it. tests/test_routing_policy_toy.py uses it.

last-replica: the last replica by name that is not excluded; with X-Session-Id "first", the first.
"""
from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from typing import Any, ClassVar

from llmgw.routing import RoutingParams, register
from llmgw.routing.policy import R


@register
class LastReplica:
    name: ClassVar[str] = "toy-last-replica"
    description: ClassVar[str] = "the last replica by name (a test's toy)."

    def __init__(self, params: RoutingParams) -> None:
        self.picks = 0

    def key(self, doc: Mapping[str, Any], session: bytes | None) -> bool:
        return session == b"first"   # made once per request, handed to pick

    def pick(self, replicas: Sequence[R], inflight: Mapping[str, int], key: Any,
             exclude: Collection[str] = ()) -> R | None:
        ordered = sorted((b for b in replicas if b.replica not in exclude), key=lambda b: b.replica)
        if not ordered:
            return None
        self.picks += 1
        return ordered[0] if key else ordered[-1]

"""The gateway's request chain: the steps every proxied request runs, in order (step.py).

Adding a step (an adapter router, a precise-prefix index lookup) is one module in steps/ and
one line in `standard` (docs/architecture.md, "Adding a gateway step").
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from llmgw.gateway.admission import Admission
from llmgw.gateway.auth import Authenticator
from llmgw.gateway.queue import WaitQueues
from llmgw.gateway.scope import Scope
from llmgw.gateway.step import Step
from llmgw.gateway.steps.admit import Admit
from llmgw.gateway.steps.authenticate import Authenticate
from llmgw.gateway.steps.endpoint import Endpoint
from llmgw.gateway.steps.parse import Parse
from llmgw.gateway.steps.resolve import Resolve
from llmgw.gateway.steps.wait import Wait
from llmgw.gateway.table import RoutingTable


@dataclass(frozen=True)
class Wiring:
    """What the steps are built from: the gateway's parts and settings."""

    table: RoutingTable
    queue: WaitQueues
    scope: Scope
    authenticator: Authenticator | None   # None: every caller is welcome
    admission: Admission | None   # with watched keys: their limits
    synced: Callable[[], bool]   # whether the routing table has had its first full view
    max_body_bytes: int
    retry_after: int


def standard(w: Wiring) -> list[Step]:
    """The chain, in order; a step the gateway is not configured for is left out."""
    chain = [
        Authenticate(w.authenticator) if w.authenticator is not None else None,
        Parse(w.max_body_bytes),
        Resolve(w.table, w.scope, w.queue, w.synced, w.retry_after),
        Endpoint(w.table),
        Admit(w.admission) if w.admission is not None else None,
        Wait(w.queue, w.retry_after),
    ]
    return [step for step in chain if step is not None]


Chain = Callable[[Wiring], list[Step]]   # how a Gateway is told its steps: `standard`, or one around it

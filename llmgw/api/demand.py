"""What a gateway reports of its demand: per model, the requests in flight and waiting at it.

Each gateway publishes one report under ``/llmgw/demand/<gateway>``, bound to an etcd lease
(``POST /demand/<gateway>``; docs/contracts.md, "Autoscaling"): a gateway that dies takes its
figures with it when the lease expires. The autoscaler (controllers/autoscaler.py) sums the
live reports per model.
"""
from __future__ import annotations

from typing import Annotated

from pydantic import Field

from llmgw.api.members import Address
from llmgw.api.meta import DNSLabel, Strict, added

MAX_MODELS_PER_REPORT = 10_000
Count = Annotated[int, Field(strict=True, ge=0, le=1 << 31)]


class ModelDemand(Strict):
    inFlight: Count = 0    # requests sent to a replica and not yet answered
    waiting: Count = 0     # requests queued at the gateway for a replica (scale from zero)
    # A LoRA adapter's: 1 while the gateway has asked a replica's agent to load it directly, or
    # routes to such a load that the adapter controller has not recorded yet (docs/contracts.md,
    # "Adapters"): the controller then places it for demand on no replica of its own.
    loading: Count = added("0.3.0", 0)

    @property
    def total(self) -> int:
        return self.inFlight + self.waiting + self.loading


class DemandReport(Strict):
    """One gateway's report: the models it has requests for (a model absent has none)."""

    gateway: DNSLabel
    models: dict[DNSLabel, ModelDemand] = Field(default_factory=dict, max_length=MAX_MODELS_PER_REPORT)
    version: str | None = None   # the gateway's llmgw version: its X-Llmgw-Version, set by the server
    metrics: Address | None = None   # HOST:PORT of its GET /metrics (its --listen; llmgw/api/members.py)


def total_demand(reports: list[DemandReport] | tuple[DemandReport, ...], model: str) -> ModelDemand:
    """The model's demand summed over the gateways' reports."""
    inflight = waiting = loading = 0
    for report in reports:
        d = report.models.get(model)
        if d is not None:
            inflight += d.inFlight
            waiting += d.waiting
            loading += d.loading
    return ModelDemand(inFlight=inflight, waiting=waiting, loading=loading)

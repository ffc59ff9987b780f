"""What a gateway reports of its API keys' usage, and the sum over the live gateways.

Each gateway with ``--watch-api-keys`` sends its keys' usage with its demand report
(``POST /demand/<gateway>``, field ``keys``); the server keeps it under
``/llmgw/usage/<gateway>``, bound to the same lease as the demand report, so a gateway that
dies takes its figures with it. ``GET /usage/apikeys`` answers the sum over the live
gateways (``total_usage``): what ``llmgw describe apikey`` and ``llmgw get apikeys`` show.
Keys are named by their object name; no report holds a secret. A gateway with
``--watch-api-keys`` sends ``keys`` in every report, an empty one too, and no other gateway sends it:
so the reports kept are those of the live gateways that enforce the ApiKeys, and ``gateways`` in
``GET /usage/apikeys`` counts them (``llmgw create apikey`` and ``get apikeys`` warn when it is 0).
"""
from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime
from typing import Annotated

from pydantic import Field

from llmgw.api.meta import DNSLabel, Strict

MAX_KEYS_PER_REPORT = 10_000
MAX_MODELS_PER_KEY = 1_000
Count = Annotated[int, Field(strict=True, ge=0, le=1 << 62)]   # tokens since a gateway started


class Tally(Strict):
    requests: Count = 0            # admitted
    promptTokens: Count = 0        # as the engines reported them (usage)
    completionTokens: Count = 0
    rateLimited: Count = 0         # refused 429 by the key's limits

    def __add__(self, other: Tally) -> Tally:
        return Tally(requests=self.requests + other.requests, promptTokens=self.promptTokens + other.promptTokens,
                     completionTokens=self.completionTokens + other.completionTokens,
                     rateLimited=self.rateLimited + other.rateLimited)


class ModelUsage(Strict):
    """A key's usage of one model: since the gateway started, and over the last minute and hour."""

    total: Tally = Field(default_factory=Tally)
    lastMinute: Tally = Field(default_factory=Tally)
    lastHour: Tally = Field(default_factory=Tally)

    def __add__(self, other: ModelUsage) -> ModelUsage:
        return ModelUsage(total=self.total + other.total, lastMinute=self.lastMinute + other.lastMinute,
                          lastHour=self.lastHour + other.lastHour)


class KeyUsage(Strict):
    lastUsed: datetime | None = None   # the last request of the key, admitted or refused; None: never
    models: dict[DNSLabel, ModelUsage] = Field(default_factory=dict, max_length=MAX_MODELS_PER_KEY)


class UsageReport(Strict):
    """One gateway's report: the keys it has seen requests of since it started."""

    gateway: DNSLabel
    keys: dict[DNSLabel, KeyUsage] = Field(default_factory=dict, max_length=MAX_KEYS_PER_REPORT)


def total_usage(reports: Iterable[UsageReport]) -> dict[str, KeyUsage]:
    """Each key's usage summed over the gateways' reports: figures added, the latest last use."""
    out: dict[str, KeyUsage] = {}
    for report in reports:
        for name, usage in report.keys.items():
            have = out.get(name)
            if have is None:
                out[name] = usage.model_copy(deep=True)
                continue
            if usage.lastUsed is not None and (have.lastUsed is None or usage.lastUsed > have.lastUsed):
                have.lastUsed = usage.lastUsed
            for model, m in usage.models.items():
                have.models[model] = have.models[model] + m if model in have.models else m
    return out

"""Choosing a replica: each model's routing policy (llmgw.routing, by its Model's spec.routing),
given the requests in flight at this gateway, which the balancer counts."""
from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Callable

from llmgw.api import RoutingSpec
from llmgw.gateway.kvindexes import KVIndexes
from llmgw.gateway.table import Backend
from llmgw.routing import POLICIES, RoutingPolicy
from llmgw.routing.precise_prefix import PrecisePrefix


class Balancer:
    def __init__(self, kv: KVIndexes | None = None) -> None:
        self.kv = kv if kv is not None else KVIndexes()  # the models' KV indexes, for precise-prefix
        self.inflight: dict[str, int] = defaultdict(int)  # replica -> outstanding requests
        self.model_of: dict[str, str] = {}  # replica -> model, while it has outstanding requests
        self.per_model: dict[str, int] = defaultdict(int)  # model -> outstanding requests (its concurrency)
        self.on_release: Callable[[str], None] | None = None  # (model) after a request ended: room for a waiter
        self.sent: dict[str, float] = {}  # adapter -> when (monotonic) a request for it was last sent
        self.sends: dict[str, int] = {}   # adapter -> requests sent for it since this gateway last loaded it
        self._policies: dict[str, tuple[RoutingSpec, RoutingPolicy]] = {}  # model -> (its routing, policy)

    def policy(self, model: str, routing: RoutingSpec, base: str | None = None) -> RoutingPolicy:
        """The model's policy instance; a new one (with fresh state) when its routing changed. An
        adapter's (`base`: the model it runs on) reads its base's KV index, keyed with the adapter."""
        held = self._policies.get(model)
        if held is None or held[0] is not routing:
            held = self._policies[model] = (routing, POLICIES[routing.policy](routing))
            if isinstance(held[1], PrecisePrefix):
                held[1].kv = self.kv.index(base or model)
                held[1].lora = model if base not in (None, model) else None
        return held[1]

    def acquire(self, b: Backend) -> None:
        if b.base is not None:   # an adapter's: its recency and frequency, which a direct load's victim is chosen by
            self.sent[b.model] = time.monotonic()   # (loads.py)
            self.sends[b.model] = self.sends.get(b.model, 0) + 1
        self.inflight[b.replica] += 1
        self.model_of[b.replica] = b.model
        self.per_model[b.model] += 1

    def release(self, b: Backend) -> None:
        n = self.inflight[b.replica] - 1
        if n <= 0:
            del self.inflight[b.replica]
            self.model_of.pop(b.replica, None)
        else:
            self.inflight[b.replica] = n
        m = self.per_model[b.model] - 1
        if m <= 0:
            del self.per_model[b.model]
        else:
            self.per_model[b.model] = m
        held = self._policies.get(b.model)
        if held is not None and isinstance(held[1], PrecisePrefix):
            held[1].done(b.replica)
        if self.on_release is not None:
            self.on_release(b.model)

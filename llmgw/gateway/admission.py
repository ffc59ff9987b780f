"""Per-key admission at the gateway: scope, limits, usage (docs/gateway.md, "API keys").

A request whose key (keyring.py) was verified is admitted here once its model is known:

- scope: a key may call the models its spec names (names or aliases) or whose labels match its
  modelSelector (every model when it says neither); another model is answered 404 in OpenAI's
  "model not found" shape, the same as a model that does not exist, so a key cannot learn which
  models exist beyond its own;
- limits, each this gateway's share (the key's limit / the live gateways, `gateways`: from the
  server's answer to each demand report, demand.py): requests per minute and tokens per minute as
  token buckets refilled continuously (a bucket holds a minute's share, at least one request), and
  requests in flight (the share rounded up). A refusal is a 429 with Retry-After, retry-after-ms
  and x-ratelimit-* headers (OpenAI's), and an OpenAI-shaped body. Tokens are those the engine
  reports (`usage`), taken from the bucket when the response ends: a request is admitted while
  the bucket is not in debt, so one request may overshoot a token limit by its own size;
- a Ticket per admitted request, held until it is answered: it counts the key's requests in flight,
  carries the key's priority class to the model's wait queue (request.priority, queue.py), and ends
  the request (its client connection closed) when the key is deleted or expires.

Usage per key (its object name, never its secret) and model is counted as Prometheus series,
and reported beside the demand report for `llmgw describe apikey` (usage.py).
"""
from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.metrics_core import Metric

from llmgw.api import ApiKey
from llmgw.gateway.errors import error_response
from llmgw.gateway.response import Response
from llmgw.gateway.usage import UsageWindows

SECONDS_PER_MINUTE = 60.0


class Bucket:
    """A token bucket holding up to `size` units, refilled at `size` per minute."""

    __slots__ = ("size", "level", "stamp")

    def __init__(self, size: float) -> None:
        self.size = size
        self.level = size
        self.stamp = time.monotonic()

    def refill(self, now: float) -> float:
        self.level = min(self.size, self.level + (now - self.stamp) * self.size / SECONDS_PER_MINUTE)
        self.stamp = now
        return self.level

    def wait(self, need: float) -> float:
        """Seconds until the bucket holds `need` units."""
        return max(0.0, (need - self.level) * SECONDS_PER_MINUTE / self.size)

    def reset(self) -> float:
        """Seconds until it is full again."""
        return self.wait(self.size)


class _KeyState:
    """What this gateway keeps of one key it has admitted requests of."""

    __slots__ = ("key", "requests", "tokens", "tickets")

    def __init__(self, key: ApiKey, gateways: int) -> None:
        self.key = key
        self.requests: Bucket | None = None
        self.tokens: Bucket | None = None
        self.tickets: set[Ticket] = set()
        self.resize(key, gateways)

    def resize(self, key: ApiKey, gateways: int) -> None:
        """Buckets sized to the key's limits / the gateways; what they hold is kept (up to the size)."""
        self.key = key
        lim = key.spec.limits
        self.requests = _sized(self.requests, lim.requestsPerMinute, gateways, floor=1.0)
        self.tokens = _sized(self.tokens, lim.tokensPerMinute, gateways, floor=0.0)


def _sized(bucket: Bucket | None, limit: int | None, gateways: int, floor: float) -> Bucket | None:
    if limit is None:
        return None
    size = max(floor, limit / gateways) or 1.0
    if bucket is None:
        return Bucket(size)
    bucket.size = size
    bucket.level = min(bucket.level, size)
    return bucket


class Ticket:
    """One admitted request of a key: released (once) when it is answered."""

    __slots__ = ("state", "counts", "end", "released")

    def __init__(self, state: _KeyState, counts: list[int], end: Callable[[], None]) -> None:
        self.state, self.counts, self.end = state, counts, end   # counts: the key's and model's usage
        self.released = False

    @property
    def key(self) -> str:
        return self.state.key.name

    def used(self, counted: tuple[int, int] | None) -> None:
        """The engine's usage of the answer: (prompt, completion) tokens, or None if it reported none."""
        if counted is None:
            return
        prompt, completion = counted
        bucket = self.state.tokens
        if bucket is not None:
            bucket.refill(time.monotonic())
            bucket.level -= prompt + completion
        u = self.counts
        u[1] += prompt
        u[2] += completion

    def release(self) -> None:
        if not self.released:
            self.released = True
            self.state.tickets.discard(self)


class Admission:
    def __init__(self, labels: Callable[[str], dict[str, str]], resolve: Callable[[str], str | None]) -> None:
        """`labels(model)`: a Model's labels; `resolve(name)`: the model a name or alias is of (the table's)."""
        self.labels, self.resolve = labels, resolve
        self.gateways = 1
        self._states: dict[str, _KeyState] = {}
        self._usage: dict[tuple[str, str], list[int]] = {}   # (key, model) -> [requests, prompt, completion]
        self.last_used: dict[str, float] = {}   # key -> time.time() of its last request, admitted or refused

    # ------------------------------------------------------------ scope

    def allows(self, key: ApiKey, model: str) -> bool:
        spec = key.spec
        if spec.any_model:
            return True
        resolve = self.resolve
        if any(resolve(n) == model for n in spec.models):
            return True
        selector = spec.modelSelector
        if selector:
            labels = self.labels(model)
            return all(labels.get(k) == v for k, v in selector.items())
        return False

    # ------------------------------------------------------------ limits

    def admit(self, key: ApiKey, model: str, end: Callable[[], None]) -> Ticket | Response:
        """A ticket for one request of `key` to `model`, or the 429 it gets (nothing taken then).
        `end()` ends the request if the key is revoked while it is in flight."""
        state = self._states.get(key.name)
        if state is None:
            state = self._states[key.name] = _KeyState(key, self.gateways)
        elif state.key is not key:   # the key changed (its limits may have)
            state.resize(key, self.gateways)
        lim = key.spec.limits
        if lim.concurrentRequests is not None:
            share = math.ceil(lim.concurrentRequests / self.gateways)
            if len(state.tickets) >= share:
                return self._refused(key, model, "concurrent requests", lim.concurrentRequests, share, 1.0, {},
                                     "concurrency_limit_exceeded")
        now = time.monotonic()
        requests, tokens = state.requests, state.tokens
        if requests is not None and requests.refill(now) < 1.0:
            return self._refused(key, model, "requests per minute", lim.requestsPerMinute, requests.size,
                                 requests.wait(1.0), self._headers(state), "rate_limit_exceeded")
        if tokens is not None and tokens.refill(now) <= 0.0:
            return self._refused(key, model, "tokens per minute", lim.tokensPerMinute, tokens.size,
                                 tokens.wait(1.0), self._headers(state), "tokens_limit_exceeded")
        if requests is not None:
            requests.level -= 1.0
        counts = self.usage(key.name, model)
        counts[0] += 1
        self.last_used[key.name] = time.time()
        ticket = Ticket(state, counts, end)
        state.tickets.add(ticket)
        return ticket

    def set_gateways(self, n: int) -> None:
        """The live gateways (this one included) share each limit from now on."""
        n = max(1, n)
        if n == self.gateways:
            return
        self.gateways = n
        for state in self._states.values():
            state.resize(state.key, n)

    def revoke(self, name: str) -> None:
        """The key was deleted or expired: end its requests in flight, forget its buckets."""
        state = self._states.pop(name, None)
        if state is None:
            return
        for ticket in list(state.tickets):
            ticket.release()
            ticket.end()

    def in_flight(self, name: str) -> int:
        state = self._states.get(name)
        return len(state.tickets) if state is not None else 0

    def _headers(self, state: _KeyState) -> dict[str, str]:
        """OpenAI's x-ratelimit-* of the key's buckets (made for a refusal only: they cost a
        microsecond or two, which an admitted request does not pay)."""
        out = {}
        lim = state.key.spec.limits
        for what, limit, bucket in (("requests", lim.requestsPerMinute, state.requests),
                                    ("tokens", lim.tokensPerMinute, state.tokens)):
            if bucket is None or limit is None:
                continue
            # The remaining count is this gateway's share's, scaled to all gateways: an estimate.
            remaining = min(limit, max(0, math.floor(bucket.level * self.gateways)))
            out[f"x-ratelimit-limit-{what}"] = str(limit)
            out[f"x-ratelimit-remaining-{what}"] = str(remaining)
            out[f"x-ratelimit-reset-{what}"] = duration(bucket.reset())
        return out

    def _refused(self, key: ApiKey, model: str, what: str, limit: int | None, share: float, wait: float,
                 headers: dict[str, str], code: str) -> Response:
        wait = max(wait, 0.001)
        lines = b"".join(f"{k}: {v}\r\n".encode() for k, v in {
            "Retry-After": str(math.ceil(wait)), "retry-after-ms": str(math.ceil(wait * 1000)), **headers}.items())
        gateways = f" ({share:g} at this gateway, one of {self.gateways})" if self.gateways > 1 else ""
        return error_response(
            429, f"Rate limit reached for API key {key.name} on {what}: limit {limit}{gateways}; "
            f"retry in {wait:.1f} s", "rate_limit_error", None, code, headers=lines)

    # ------------------------------------------------------------ usage

    def refused(self, key: str, model: str) -> None:
        """A request of the key was answered 429 by its limits."""
        self.usage(key, model)[3] += 1
        self.last_used[key] = time.time()

    def usage(self, key: str, model: str) -> list[int]:
        """[requests admitted, prompt tokens, completion tokens, requests refused] of a key and model
        (usage.py's FIELDS)."""
        u = self._usage.get((key, model))
        if u is None:
            u = self._usage[(key, model)] = [0, 0, 0, 0]
        return u

    def windows(self) -> UsageWindows:
        """The usage this gateway reports beside its demand (usage.py)."""
        return UsageWindows(self._usage, self.last_used)

    def collector(self) -> "UsageCollector":
        return UsageCollector(self._usage, lambda: self.gateways)


def duration(seconds: float) -> str:
    """OpenAI's form of x-ratelimit-reset-*: 20ms, 1s, 6m0s, 1h2m3s."""
    if seconds < 1:
        return f"{math.ceil(seconds * 1000)}ms"
    s = math.ceil(seconds)
    h, rest = divmod(s, 3600)
    m, s = divmod(rest, 60)
    return (f"{h}h{m}m{s}s" if h else f"{m}m{s}s" if m else f"{s}s")


class UsageCollector:
    """The usage series by key and model, read at scrape time."""

    _SERIES = (
        ("llmgw_gateway_key_requests", "Requests admitted, by API key (its object name) and model", 0),
        ("llmgw_gateway_key_input_tokens", "Prompt tokens the engines reported, by API key and model", 1),
        ("llmgw_gateway_key_output_tokens", "Completion tokens the engines reported, by API key and model", 2),
        ("llmgw_gateway_key_rate_limited", "Requests refused 429 by the key's limits, by API key and model", 3),
    )

    def __init__(self, usage: dict[tuple[str, str], list[int]], gateways: Callable[[], int]) -> None:
        self.usage, self.gateways = usage, gateways

    def describe(self) -> Iterator[Metric]:
        return iter(())

    def collect(self) -> Iterator[Metric]:
        rows: list[tuple[tuple[str, str], Any]] = sorted(self.usage.items())
        for name, doc, i in self._SERIES:
            family = CounterMetricFamily(name, doc, labels=["key", "model"])
            for (key, model), u in rows:
                family.add_metric([key, model], u[i])
            yield family
        yield GaugeMetricFamily("llmgw_gateway_key_limit_gateways", "Live gateways that share each API key's "
                                "limits (this one included), from the server's answer to its demand reports",
                                value=self.gateways())

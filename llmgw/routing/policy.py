"""What a routing policy is: the protocol each one implements, and the registry of them by name.

A policy chooses, for one request, one of a model's replicas. The gateway makes one
instance per model (a new one when the Model's ``spec.routing`` changes), so an
instance may keep state across that model's requests (a hash ring, a prefix index,
a round-robin turn). Per request the gateway asks it for a ``key`` once (a retry
reuses it) and then to ``pick`` among the replicas not yet tried, given the
requests in flight at this gateway; the gateway counts those itself (acquire on
the pick, release at the end), so what a request costs a replica is one request
in flight, whatever the policy.

A policy is registered by name (``@register``) and the Model's ``spec.routing.policy``
is validated against the registry (``llmgw.api``), so a new policy is one module
that defines a class and registers it (docs/architecture.md, "Adding a routing
policy"). This package imports nothing else of llmgw: the API's types validate
against it, and the gateway runs it.
"""
from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from typing import Any, ClassVar, Protocol, TypeVar


class Routed(Protocol):
    """A replica the gateway may send the request to (the gateway's Backend)."""

    @property
    def replica(self) -> str: ...


class RoutingParams(Protocol):
    """The Model's spec.routing, as a policy reads it (llmgw.api.RoutingSpec)."""

    @property
    def policy(self) -> str: ...
    @property
    def prefixBytes(self) -> int: ...
    @property
    def loadBound(self) -> float: ...
    @property
    def indexBytes(self) -> int: ...


R = TypeVar("R", bound=Routed)


class RoutingPolicy(Protocol):
    name: ClassVar[str]           # what spec.routing.policy says
    description: ClassVar[str]    # one sentence, for the Model's schema (crds/) and docs

    def __init__(self, params: RoutingParams) -> None: ...

    def key(self, doc: Mapping[str, Any], session: bytes | None) -> Any:
        """What the policy needs of the request (its parsed JSON body and the X-Session-Id
        header), made once per request; None when it needs nothing."""
        ...

    def pick(self, replicas: Sequence[R], inflight: Mapping[str, int], key: Any,
             exclude: Collection[str] = ()) -> R | None:
        """The replica for the request, none of `exclude` (replica names already tried);
        `inflight`: requests in flight at this gateway per replica name. None: no candidate."""
        ...

    def predicted(self, key: Any, replica: str) -> tuple[int, int] | None:
        """(tokens, block size): the prompt's tokens the engine at `replica`, just picked for the
        request of `key`, should find cached, by what the policy knows of the engines' caches (the
        gateway checks it against the engine's reported cached tokens); None where it knows nothing
        of them (a policy that routes on its own guess)."""
        ...


POLICIES: dict[str, type[RoutingPolicy]] = {}
DEFAULT = "least-outstanding"

P = TypeVar("P", bound=type[RoutingPolicy])


def register(cls: P) -> P:
    """Make a policy class known by its name (a class decorator)."""
    if cls.name in POLICIES and POLICIES[cls.name] is not cls:
        raise ValueError(f"routing policy {cls.name!r} is registered twice")
    POLICIES[cls.name] = cls
    return cls


def check_name(name: str) -> str:
    """`name` if a policy of that name is registered; ValueError naming the known ones."""
    if name not in POLICIES:
        raise ValueError(f"unknown routing policy {name!r}: one of {', '.join(sorted(POLICIES))}")
    return name


def describe() -> str:
    """Every registered policy's description, for the schema of spec.routing.policy."""
    return " ".join(f"{name}: {POLICIES[name].description}" for name in sorted(POLICIES))


"""Object metadata, conditions and the strict base model shared by every kind.

Field names are the wire names (camelCase, as in Kubernetes), so a model's
attribute, its JSON and its YAML all spell a field the same way.
"""
from __future__ import annotations

import re
from collections.abc import Callable
from datetime import datetime, timezone
from typing import Annotated, Any, Final, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field

from llmgw.api.limits import INT64
from llmgw.api.selectors import check_label_key, check_label_value

API_VERSION: Final = "llmgw.io/v1"

_DNS1123_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")


def check_dns1123_label(value: str) -> str:
    if len(value) > 63 or not _DNS1123_LABEL.match(value):
        raise ValueError(
            f"{value!r} is not a DNS-1123 label (lower-case letters, digits and '-', "
            "starting and ending with a letter or digit, at most 63 characters)"
        )
    return value


DNSLabel = Annotated[str, AfterValidator(check_dns1123_label)]
LabelKey = Annotated[str, AfterValidator(check_label_key)]
LabelValue = Annotated[str, AfterValidator(check_label_value)]

_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def check_env_name(value: str) -> str:
    if not _ENV_NAME.match(value):
        raise ValueError(f"{value!r} is not an environment variable name (a letter or '_', "
                         "then letters, digits or '_')")
    return value


EnvName = Annotated[str, AfterValidator(check_env_name)]


# A bounded integer is written out as ``Annotated[int, Field(strict=True, ge=low, le=high)]``,
# a type alias mypy reads as int: given as an integer ("3", true and 2.0 are refused, not
# converted) and within low..high.
Int = Annotated[int, Field(strict=True, ge=INT64[0], le=INT64[1])]
Bool = Annotated[bool, Field(strict=True)]


def added(since: str, default: Any = None, factory: Callable[[], Any] | None = None) -> Any:
    """The Field of an optional field added in llmgw `since` (its default, or a `factory` of it):
    left out of every document written while it holds its default, so that a component of an older
    release within the skew window, whose models refuse a field they do not know, still reads the
    objects a newer one writes (docs/contracts.md, "Storage versions")."""
    if factory is not None:
        empty = factory()
        return Field(default_factory=factory, exclude_if=lambda value: value == empty,
                     description=f"added in llmgw {since}")
    return Field(default, exclude_if=lambda value: value == default, description=f"added in llmgw {since}")


def now() -> datetime:
    return datetime.now(timezone.utc).replace(microsecond=0)


class Strict(BaseModel):
    """Base of every API model: unknown fields are an error, never dropped."""

    model_config = ConfigDict(extra="forbid", validate_assignment=False, defer_build=True)


class OwnerReference(Strict):
    kind: str
    name: str
    uid: str
    controller: Bool = True


class ObjectMeta(Strict):
    name: DNSLabel
    uid: str | None = None
    labels: dict[LabelKey, LabelValue] = Field(default_factory=dict)
    annotations: dict[LabelKey, str] = Field(default_factory=dict)
    generation: Int = 0
    # etcd's mod_revision of the spec key; compare-and-swap token for updates.
    resourceVersion: Int | None = None
    creationTimestamp: datetime | None = None
    deletionTimestamp: datetime | None = None
    finalizers: list[str] = Field(default_factory=list)
    ownerReferences: list[OwnerReference] = Field(default_factory=list)


ConditionStatus = Literal["True", "False", "Unknown"]


class Condition(Strict):
    type: str
    status: ConditionStatus
    reason: str = ""
    message: str = ""
    lastTransitionTime: datetime | None = None
    observedGeneration: Int | None = None


def set_condition(
    conditions: list[Condition],
    type: str,
    status: ConditionStatus,
    reason: str = "",
    message: str = "",
    observed_generation: int | None = None,
) -> bool:
    """Set a condition in place; lastTransitionTime moves only when status does.

    Returns True when anything changed.
    """
    for i, c in enumerate(conditions):
        if c.type == type:
            if (c.status, c.reason, c.message, c.observedGeneration) == (
                status, reason, message, observed_generation
            ):
                return False
            when = c.lastTransitionTime if c.status == status else now()
            conditions[i] = Condition(
                type=type, status=status, reason=reason, message=message,
                lastTransitionTime=when, observedGeneration=observed_generation,
            )
            return True
    conditions.append(Condition(
        type=type, status=status, reason=reason, message=message,
        lastTransitionTime=now(), observedGeneration=observed_generation,
    ))
    return True


def get_condition(conditions: list[Condition], type: str) -> Condition | None:
    return next((c for c in conditions if c.type == type), None)


def condition_true(conditions: list[Condition], type: str) -> bool:
    c = get_condition(conditions, type)
    return c is not None and c.status == "True"

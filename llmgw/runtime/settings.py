"""The controller manager's own settings: what the framework needs, whatever controllers it runs.

The application's settings class (controllers/settings.py, ``ControllerSettings``)
extends this one, so one object, one config file and one set of command-line
flags carry both; the Manager reads only the fields declared here.
"""
from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class ManagerSettings(BaseModel):
    """Settings of the leader-elected manager. Immutable; unknown names are refused."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    lease_seconds: float = Field(
        default=15.0, ge=1,
        description="Seconds of the leader lease (rounded to whole seconds): a leader that stops renewing is "
                    "replaced this long after its last renewal.")
    informer_idle_timeout: float = Field(
        default=120.0, gt=0,
        description="Seconds an informer's watch may stay silent before it is re-opened where it left off "
                    "(a stream a proxy or a half-open connection ended without a word).")

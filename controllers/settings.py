"""Every setting of the controllers, with its default, bounds and meaning: the one place they are declared.

``llmgw controller-manager`` makes a command-line flag of each field (``node_grace``
is ``--node-grace``) and reads the same names from its ``--config`` YAML file;
tests build ``ControllerSettings(node_grace=1.0)``. A controller that reads a
setting takes the object in its constructor (``SchedulerController(settings)``)
and reads ``self.settings.<name>``. To add one: a field here, with a default, a
bound and a one-line description (the flag's --help), then read it where it is
used; docs/architecture.md, "Settings".
"""
from __future__ import annotations

from pydantic import Field

from llmgw.runtime.settings import ManagerSettings


class ControllerSettings(ManagerSettings):
    """The manager's settings (lease_seconds) and the controllers'. Immutable; unknown names are refused."""

    # node lifecycle (controllers/nodelifecycle.py)
    node_grace: float = Field(
        default=30.0, ge=0,
        description="Seconds a node may be silent before it is judged lost and its replicas are moved elsewhere "
                    "(make-before-break); also the fresh grace every silent node gets after a leadership change.")
    max_silent_fraction: float = Field(
        default=0.5, ge=0, le=1,
        description="If at least this share of nodes (and at least two) is silent, assume the control plane is "
                    "cut off: judge no node lost.")
    eviction_settle: float = Field(
        default=60.0, ge=0, description="Seconds after mass silence ends before nodes still silent are judged lost.")
    eviction_rate: float = Field(
        default=0.1, gt=0, description="Most nodes judged lost per second (the first at once).")

    # replica (controllers/replica.py)
    rebuild_backoff_base: float = Field(
        default=10.0, ge=0,
        description="Seconds a failed replica waits before its second rebuild in a row (the first is at once), "
                    "doubling with each further failure.")
    rebuild_backoff_max: float = Field(
        default=300.0, ge=0, description="Most seconds a failing replica waits before it is rebuilt.")
    rebuild_backoff_reset: float = Field(
        default=600.0, ge=0,
        description="Seconds a replica must have been Ready for its next failure to count as the first again.")

    # scheduler, drain (controllers/scheduler.py, controllers/drain.py)
    scheduler_retry: float = Field(
        default=5.0, gt=0,
        description="Seconds before an unschedulable replica is tried again (a node change or freed GPUs try it "
                    "at once).")
    drain_resync: float = Field(
        default=30.0, gt=0,
        description="Seconds between looks at a draining node when no event wakes it (a safety net).")

    # autoscaler (controllers/autoscaler.py)
    autoscale_interval: float = Field(
        default=1.0, gt=0,
        description="Seconds between an autoscaled model's looks at its demand when no report wakes it (the "
                    "stabilization windows and the scale-to-zero delay are counted in these looks).")

    # adapters (controllers/adapter.py)
    adapter_idle_seconds: float = Field(
        default=300.0, ge=0,
        description="Seconds an adapter loaded for the gateways' demand (beyond its minReplicas) stays placed "
                    "after its last request.")

    # gitops (controllers/gitops.py)
    git_timeout: float = Field(
        default=120.0, gt=0, description="Seconds a git command of a GitSource's fetch may run before it is killed.")
    git_credentials_dir: str = Field(
        default="/etc/llmgw/git",
        description="Directory of the GitSources' credentials: a secretRef.file is a file name in it, and a "
                    "link out of it is refused.")
    git_file_root: str = Field(
        default="",
        description="Directory a GitSource's file:// URL must be inside; empty: file:// URLs are refused.")
    gitops_retry_base: float = Field(
        default=1.0, gt=0,
        description="Seconds before a GitSource whose fetch or apply failed is tried again, doubling with each "
                    "failure in a row (jittered, llmgw/backoff.py).")
    gitops_retry_max: float = Field(
        default=300.0, gt=0, description="Most seconds between a failing GitSource's tries.")

    # etcd compaction
    compact_keep: int = Field(
        default=10000, ge=1,
        description="Revisions of etcd's history kept by each compaction (a watch further behind lists again).")
    compact_interval: float = Field(
        default=300.0, gt=0, description="Seconds between compactions of etcd's history.")


# What a controller built without settings (as in most tests) reads.
DEFAULTS = ControllerSettings()

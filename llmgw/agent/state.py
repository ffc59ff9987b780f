"""The agent's state directory: one record per shard it runs, so a restarted agent can adopt.

    <state-dir>/shards/<shard>.json    shard name and uid, its GPUs and ports, and per command:
                                       pid, start time, log
    <state-dir>/logs/<shard>/<command>.log     the latest run of the shard on this node
    <state-dir>/logs/<shard>/<command>.log.1   the run before it (`llmgw logs --previous`)

A record is written right after the engine processes start and removed once
they are confirmed gone.
"""
from __future__ import annotations

import json
import logging
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path

log = logging.getLogger(__name__)


@dataclass
class ProcessRecord:
    name: str            # the rendered command's name (sim, vllm, ray-head, ...)
    pid: int             # also its process group id: each command leads its own session
    start_time: int      # /proc/<pid>/stat field 22, to defeat pid reuse
    log: str
    serves: bool = False
    term_leader: bool = False   # SIGTERM to the leader alone first (see llmgw.engines.base.Command)


@dataclass
class ShardRecord:
    shard: str
    uid: str | None
    processes: list[ProcessRecord] = field(default_factory=list)
    probe_kind: str = "process"
    probe_url: str | None = None
    started_at: str | None = None   # ISO time the engine was started
    # What the engine was given; None (a record written before these were kept): everything.
    gpus: list[int] | None = None
    ports: list[int] | None = None
    weights: str | None = None      # the cached digest its engine was started on (kept from eviction)


class StateDir:
    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root)
        self.shards = self.root / "shards"
        self.logs = self.root / "logs"

    def prepare(self) -> None:
        try:
            self.shards.mkdir(parents=True, exist_ok=True)
            self.logs.mkdir(parents=True, exist_ok=True)
        except OSError as err:
            raise OSError(f"cannot create the agent's state directory {self.root}: "
                          f"{err.strerror or err}") from None

    def log_path(self, shard: str, command: str) -> Path:
        return self.logs / shard / f"{command}.log"

    def logs_of(self, shard: str, previous: bool = False) -> dict[str, Path]:
        """The shard's logs by command: its latest run's on this node, or the run's before it."""
        d = self.logs / shard
        suffix = ".log.1" if previous else ".log"
        found = sorted(d.glob(f"*{suffix}")) if d.is_dir() else []
        return {p.name.removesuffix(suffix): p for p in found}

    def rotate_logs(self, shard: str) -> None:
        """A new run of the shard starts here: its latest run's logs become the previous run's
        (one kept), so a crashed engine's log outlives the rebuild that follows."""
        for path in self.logs_of(shard, previous=True).values():
            path.unlink(missing_ok=True)
        for path in self.logs_of(shard).values():
            os.replace(path, path.with_name(path.name + ".1"))

    def work_dir(self, shard: str) -> Path:
        d = self.logs / shard
        d.mkdir(parents=True, exist_ok=True)
        return d

    def _path(self, shard: str) -> Path:
        return self.shards / f"{shard}.json"

    def save(self, record: ShardRecord) -> None:
        path = self._path(record.shard)
        tmp = path.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(asdict(record), indent=2) + "\n")
        os.replace(tmp, path)      # atomic: a crash leaves the old record or the new one

    def remove(self, shard: str) -> None:
        try:
            self._path(shard).unlink()
        except FileNotFoundError:
            pass

    def load_all(self) -> dict[str, ShardRecord]:
        """Every readable record by shard name; unreadable ones are logged and skipped."""
        out: dict[str, ShardRecord] = {}
        if not self.shards.is_dir():
            return out
        for path in sorted(self.shards.glob("*.json")):
            try:
                data = json.loads(path.read_text())
                data["processes"] = [ProcessRecord(**p) for p in data.get("processes", [])]
                rec = ShardRecord(**data)
            except (OSError, ValueError, TypeError) as err:
                log.error("skipping unreadable agent state record %s: %s", path, err)
                continue
            out[rec.shard] = rec
        return out

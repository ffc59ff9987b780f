"""One shard's life on this node: pull, preflight, start, probe, report, stop; or adopt and carry on.

Phases: Pending -> Pulling (a pulled source's weights into the node's cache, llmgw.agent.pulling;
skipped for a path) -> Pending (preflight, waiting its turn) -> Starting (launching) -> Running (processes alive,
not yet healthy) -> Ready (probe passes); Failed (exitCode, message, logTail);
Stopping -> Stopped once a deleted shard's processes are confirmed gone.
A shard never restarts: after Failed its replica is rebuilt elsewhere.

Before launching, a runner waits its turn (llmgw.agent.claims: no other engine
of this node may still hold its GPUs or ports) and checks that no foreign
process holds its ports (else Failed, reason PortInUse). Ready needs the probe
to pass and the port it probes to be held by this engine's processes alone.
"""
from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Awaitable, Callable
from urllib.parse import urlsplit

import aiohttp

from llmgw.agent import ports, process
from llmgw.agent.adapters import AdapterBook, AdapterCounts, EngineAdapters, EngineError, Refused
from llmgw.agent.claims import Claim, Claims
from llmgw.agent.config import AgentConfig
from llmgw.agent.facts import Facts
from llmgw.agent.preflight import PreflightError, prepare
from llmgw.agent.pulling import weights_for
from llmgw.agent.reporter import StatusReporter
from llmgw.agent.state import ProcessRecord, ShardRecord, StateDir
from llmgw.api import Shard, ShardStatus, now, set_condition
from llmgw.engines import ENGINES
from llmgw.engines.base import join_host_port, url_host
from llmgw.weights.puller import Puller

log = logging.getLogger(__name__)

UNHEALTHY_AFTER = 3          # failed probes in a row before Ready falls back to Running
POLL = 0.2                   # how often an adopted (not our child) process is checked
LISTEN_TIMEOUT = 120.0       # how long a command gets to listen before the next one starts


@dataclass
class Context:
    node: str
    config: AgentConfig
    facts: Facts
    state: StateDir
    reporter: StatusReporter
    http: dict[str, Any] = field(default_factory=dict)     # shared aiohttp session, made on first probe
    claims: Claims = field(default_factory=Claims)
    # Called with the ports of the node's range held by foreign processes, at each check.
    foreign_ports: Callable[[list[int]], Awaitable[None]] | None = None
    puller: Puller | None = None          # the node's weights cache and its pulls
    failures: dict[str, int] = field(default_factory=dict)   # model -> shards of it that went Failed here
    adapters: AdapterBook = field(default_factory=AdapterBook)   # the Adapters, by watch
    adapter_counts: AdapterCounts = field(default_factory=AdapterCounts)   # its engines' loads, for /metrics

    async def session(self) -> aiohttp.ClientSession:
        s = self.http.get("session")
        if s is None or s.closed:
            s = self.http["session"] = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=2))
        return s


class EngineProcess:
    """A started command: our child (exit code known) or adopted from an earlier agent."""

    def __init__(self, record: ProcessRecord, child: asyncio.subprocess.Process | None = None):
        self.record = record
        self.child = child
        self._wait: asyncio.Task[Any] | None = None

    @property
    def pid(self) -> int:
        return self.record.pid

    def waiter(self) -> asyncio.Task[Any]:
        if self._wait is None:
            self._wait = asyncio.ensure_future(self._wait_exit())
        return self._wait

    async def _wait_exit(self) -> int | None:
        if self.child is not None:
            return await self.child.wait()
        while process.is_alive(self.pid, self.record.start_time):  # noqa: ASYNC110 not our child: nothing to await
            await asyncio.sleep(POLL)
        return None

    def alive(self) -> bool:
        if self.child is not None and self.child.returncode is not None:
            return False
        return process.is_alive(self.pid, self.record.start_time)

    def has_processes(self) -> bool:
        """Anything of ours still runs in its process group (the leader, or children it left).

        A pid is never reused while a process group of that id exists, so members of the
        group are ours unless the pid now belongs to another process (other start time).
        """
        if self.alive():
            return True
        if process.start_time(self.pid) not in (None, self.record.start_time):
            return False
        return bool(process.group_members(self.pid))


def own_ports(shard: Shard) -> list[int]:
    """The ports a shard's engine binds on its node (ShardPorts.own)."""
    return shard.spec.ports.own(shard.spec.rank)


class ShardRunner:
    def __init__(self, ctx: Context, shard: Shard, record: ShardRecord | None = None):
        self.ctx = ctx
        self.shard = shard
        self.name = shard.name
        self.uid = shard.metadata.uid
        self.record = record
        self.claim = ctx.claims.add(Claim(f"shard {shard.name}", shard.spec.gpus, own_ports(shard),
                                          held=record is not None))
        if record is not None:
            self.claim.pgids = [p.pid for p in record.processes]
        self.status = shard.status.model_copy(deep=True)
        self.procs: list[EngineProcess] = []
        self.stop_requested = asyncio.Event()
        self.drain = True
        self.task: asyncio.Task[None] | None = None
        self.weights: str | None = None       # the cached digest its engine uses, pinned while it lives
        self.adapters_changed = asyncio.Event()   # the Adapters changed: sync its engine's (adapters.py)
        self._adapters: EngineAdapters | None = None

    # -------------------------------------------------------------- inputs
    def start(self) -> asyncio.Task[None]:
        self.task = asyncio.ensure_future(self._main())
        return self.task

    def update(self, shard: Shard) -> None:
        self.shard = shard
        if shard.metadata.deletionTimestamp is not None:
            self.stop_requested.set()

    def gone(self) -> None:
        """The shard object was deleted outright."""
        self.stop_requested.set()

    # ------------------------------------------------------------- reports
    def _set(self, phase: str, **fields: Any) -> None:
        s = self.status
        if phase != "Ready":
            fields.setdefault("adapters", [])   # only a Ready engine is said to hold any
        changed = s.phase != phase or any(getattr(s, k) != v for k, v in fields.items())
        if not changed:
            return
        data = s.model_dump()
        data.update(fields)
        if phase != s.phase:
            data["phaseTime"] = now()
            if phase == "Failed":
                model = self.shard.spec.model
                self.ctx.failures[model] = self.ctx.failures.get(model, 0) + 1
            detail = fields.get("message") or ""
            log.info("shard %s: %s -> %s%s", self.name, s.phase, phase, f": {detail}" if detail else "")
        data["phase"] = phase
        data["observedGeneration"] = self.shard.metadata.generation
        self.status = ShardStatus(**data)
        self.ctx.reporter.want(self.name, self.status, self.uid)

    # ---------------------------------------------------------------- life
    async def _main(self) -> None:
        try:
            await self._life()
        except asyncio.CancelledError:
            raise
        except Exception as err:            # a bug must not take the agent down: say it on the shard
            log.exception("shard %s: agent error", self.name)
            self._set("Failed", message=f"agent error: {err}")
            await self.stop_requested.wait()
            await self._stop(drain=False)
        self.ctx.claims.discard(self.claim)
        if self.weights is not None and self.ctx.puller is not None:
            self.ctx.puller.cache.unpin(self.weights)
        if self._adapters is not None:
            self._adapters.release()

    async def _life(self) -> None:
        if self.record is not None:
            if self.record.uid == self.uid:
                await self._adopt(self.record)
            else:     # an earlier shard of the same name: its engine is not ours to keep
                old = [EngineProcess(p) for p in self.record.processes]
                await self._terminate([p for p in old if p.has_processes()],
                                      grace=self.ctx.config.stop_grace_period)
                self.ctx.state.remove(self.name)
                self.record = None
                self.claim.release()
        if not self.procs and not self.stop_requested.is_set():
            phase = self.status.phase
            if phase in ("Pending", "Pulling"):     # Pulling: an agent restarted mid-pull resumes it
                await self._launch()
            elif phase in ("Starting", "Running", "Ready") and self.record is None:
                self._set("Failed", exitCode=None, message=(
                    "the engine is not running: the agent found no record of it in "
                    f"{self.ctx.state.shards} when it started"))
        if self.procs:
            await self._supervise()
        await self.stop_requested.wait()
        await self._stop(drain=self.drain)

    async def _adopt(self, record: ShardRecord) -> None:
        procs = [EngineProcess(p) for p in record.processes]
        alive = [p for p in procs if p.alive()]
        if procs and len(alive) == len(procs):
            self.procs = procs
            if record.weights is not None and self.ctx.puller is not None:
                self.ctx.puller.cache.pin(record.weights)       # its engine reads them
                self.weights = record.weights
            log.info("shard %s: adopted running engine (pids %s)", self.name, [p.pid for p in procs])
            serving = self._serving()
            assert serving is not None  # there are processes
            if self.status.phase not in ("Running", "Ready", "Stopping"):
                self._set("Running", pid=serving.pid, message="")
            return
        # Some programs died while no agent watched: the shard cannot be whole again.
        dead = [p for p in procs if p not in alive]
        await self._terminate([p for p in procs if p.has_processes()],
                              grace=min(5.0, self.ctx.config.stop_grace_period))
        self.ctx.state.remove(self.name)
        self.claim.release()
        tail = process.tail(dead[0].record.log, self.ctx.config.log_lines) if dead else []
        names = ", ".join(p.record.name for p in dead) or "the engine"
        self._set("Failed", exitCode=None, logTail=tail,
                  message=f"{names} exited while the agent was not running (exit code unknown)")

    async def _launch(self) -> None:
        weights = await weights_for(self.shard, self.status, self.ctx.puller, self._set, self.stop_requested)
        if weights is None:
            return
        self.weights = weights.digest       # pinned by weights_for
        try:
            rendered = prepare(weights.shard, self.ctx.facts, await self._start_adapters())
        except PreflightError as err:
            self._set("Failed", message=f"preflight: {err}")
            return
        if not await self._wait_turn():
            return
        self._set("Starting", message="", exitCode=None, logTail=[])
        gpus, own = self.claim.gpus, self.claim.ports
        assert gpus is not None and own is not None  # a shard's claim names them (None: an old record's)
        taken = [h for h in ports.foreign(await self._port_holders()) if h.port in own]
        if taken:
            self.claim.release()
            words = "; ".join(h.describe() for h in taken)
            conditions = [c.model_copy() for c in self.status.conditions]
            set_condition(conditions, "Started", "False", "PortInUse", words)
            self._set("Failed", message=f"PortInUse: {words}", conditions=conditions)
            return
        state = self.ctx.state
        workdir = state.work_dir(self.name)
        state.rotate_logs(self.name)
        record = ShardRecord(shard=self.name, uid=self.uid, probe_kind=rendered.probe.kind,
                             probe_url=rendered.probe.url, started_at=now().isoformat(),
                             gpus=sorted(gpus), ports=sorted(own), weights=self.weights)
        for cmd in rendered.commands:
            log_path = state.log_path(self.name, cmd.name)
            env = {**os.environ, **cmd.env}
            try:
                child = await process.spawn(cmd.argv, env, log_path, workdir)
            except OSError as err:
                await self._terminate(self.procs, grace=0)
                self.procs = []
                state.remove(self.name)
                self.claim.release()
                self._set("Failed", message=f"cannot start {cmd.argv[0]}: {err.strerror or err}")
                return
            self.claim.pgids.append(child.pid)
            started = process.start_time(child.pid) or 0
            rec = ProcessRecord(name=cmd.name, pid=child.pid, start_time=started, log=str(log_path),
                                serves=cmd.serves, term_leader=cmd.term_leader)
            record.processes.append(rec)
            self.procs.append(EngineProcess(rec, child))
            state.save(record)      # after each start, so a crash mid-launch still leaves a record
            log.info("shard %s: started %s (pid %d): %s", self.name, cmd.name, child.pid, " ".join(cmd.argv))
            if cmd.listens and not await self._listening(self.procs[-1], *cmd.listens):
                return
        self.record = record
        serving = self._serving()
        self._set("Running", pid=(serving or self.procs[0]).pid, startedAt=now(), message="")

    async def _listening(self, proc: EngineProcess, host: str, port: int) -> bool:
        """Wait until `proc` accepts connections on host:port; on its exit or a timeout, fail the shard."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + LISTEN_TIMEOUT
        while proc.alive() and not self.stop_requested.is_set():
            try:
                _, writer = await asyncio.wait_for(asyncio.open_connection(host, port), timeout=1.0)
                writer.close()
                return True
            except (OSError, asyncio.TimeoutError):
                if loop.time() >= deadline:
                    break
                await asyncio.sleep(POLL)
        if self.stop_requested.is_set():
            return False    # _stop takes it from here
        if proc.alive():
            code, why = None, f"did not listen on {host}:{port} within {LISTEN_TIMEOUT:g} s"
        else:
            code, why = process.exit_description(await proc.waiter())
        await self._terminate(self.procs, grace=min(5.0, self.ctx.config.stop_grace_period))
        self.procs = []
        self.ctx.state.remove(self.name)
        self.claim.release()
        self._set("Failed", exitCode=code, logTail=process.tail(proc.record.log, self.ctx.config.log_lines),
                  message=f"{proc.record.name} (pid {proc.pid}) {why} before it listened; log: {proc.record.log}")
        return False

    async def _wait_turn(self) -> bool:
        """Hold this shard's claim once no other engine holds its GPUs or ports; False when the
        shard is deleted first."""
        turn = asyncio.ensure_future(self.ctx.claims.wait_turn(
            self.claim, lambda why: self._set("Pending", message=why)))
        stop = asyncio.ensure_future(self.stop_requested.wait())
        await asyncio.wait({turn, stop}, return_when=asyncio.FIRST_COMPLETED)
        stop.cancel()
        if turn.done() and not self.stop_requested.is_set():
            return True
        turn.cancel()
        self.claim.release()
        return False

    async def _port_holders(self) -> dict[int, list[ports.Holder]]:
        """Who holds the node's engine ports and this shard's; the foreign ones are reported."""
        rng = self.ctx.config.port_range
        own = self.claim.ports
        assert own is not None  # a shard's claim names its ports
        watched = set(range(rng.first, rng.last + 1)) | own
        held = await asyncio.to_thread(ports.holders, watched, self.ctx.claims.groups(), self.ctx.facts.address)
        if self.ctx.foreign_ports is not None:
            await self.ctx.foreign_ports(sorted({h.port for h in ports.foreign(held)
                                                 if rng.first <= h.port <= rng.last}))
        return held

    async def _answered_by_another(self) -> str:
        """Why the probe's success is not this engine's ("" when the port is this engine's alone).

        A probe can be answered by whatever listens on the port: an engine that has not
        stopped yet, or a stranger. The listening sockets are checked to belong to this
        shard's process groups, once, when the shard would go Ready.
        """
        port = urlsplit(self.record.probe_url).port if self.record and self.record.probe_url else None
        if port is None:
            return ""
        held = await asyncio.to_thread(ports.holders, {port}, [p.pid for p in self.procs], self.ctx.facts.address)
        others = ports.foreign(held)
        if others:
            await self._port_holders()      # a stranger may be new: refresh the node's foreignPorts
            return ("the health probe was answered by another process: "
                    + "; ".join(h.describe() for h in others))
        if not held:
            return f"the health probe passed, but no process of this engine listens on port {port}"
        return ""

    def _serving(self) -> EngineProcess | None:
        return next((p for p in self.procs if p.record.serves), self.procs[0] if self.procs else None)

    async def _supervise(self) -> None:
        """Probe until a process exits (Failed) or a stop is requested."""
        stop = asyncio.ensure_future(self.stop_requested.wait())
        failures = 0
        was_ready = self.status.phase == "Ready"
        failing_since: float | None = None   # since when the probe of a shard that was Ready fails
        loop = asyncio.get_running_loop()
        try:
            while True:
                waiters = [p.waiter() for p in self.procs]
                changed = asyncio.ensure_future(self.adapters_changed.wait())
                await asyncio.wait([*waiters, stop, changed], timeout=self.ctx.config.probe_interval,
                                   return_when=asyncio.FIRST_COMPLETED)
                changed.cancel()
                exited = [p for p in self.procs if p.waiter().done()]
                if exited:
                    await self._on_exit(exited[0])
                    return
                if stop.done():
                    return
                if await self._probe():
                    failures, failing_since, was_ready = 0, None, True
                    if self.status.phase != "Ready":
                        why_not = await self._answered_by_another()
                        if why_not:
                            self._set("Running", message=why_not)
                        else:   # its adapters first: Ready says they are loaded
                            self._set("Ready", message="", **await self._sync_adapters())
                    elif self._adapters is not None:
                        self._set("Ready", **await self._sync_adapters())
                else:
                    failures += 1
                    if self.status.phase == "Ready" and failures >= UNHEALTHY_AFTER:
                        assert self.record is not None  # Ready: adopted or launched, so recorded
                        self._set("Running", message=f"health probe failing ({self.record.probe_url})")
                    if was_ready:
                        failing_since = loop.time() if failing_since is None else failing_since
                        limit = self.ctx.config.liveness_timeout
                        if limit and loop.time() - failing_since >= limit:
                            await self._on_unhealthy(limit)
                            return
        finally:
            stop.cancel()

    def _engine_adapters(self) -> EngineAdapters | None:
        """Its engine's adapters (a serving shard of a Model with spec.adapters), made at first need."""
        spec = self.shard.spec
        api = ENGINES[spec.engine].lora if spec.engine in ENGINES else None
        if spec.adapters is None or spec.rank != 0 or api is None:
            return None
        if self._adapters is None:
            url = f"http://{join_host_port(url_host(self.ctx.facts.address), spec.ports.serve)}"
            self._adapters = EngineAdapters(url, api, self.ctx.adapters, self.ctx.session, self.ctx.puller,
                                            spec.model, self.ctx.adapter_counts)
        return self._adapters

    async def _start_adapters(self) -> list[str]:
        """The weights of the adapters its engine is given at start, where it takes them only then
        (llama-server): the Model's, in their start order, at most spec.adapters.maxLoaded."""
        adapters, slots = self._engine_adapters(), self.shard.spec.adapters
        if adapters is None or slots is None or not adapters.api.at_start:
            return []
        return await adapters.start_weights(self.ctx.adapters.start_order(self.shard.spec.model)[:slots.maxLoaded])

    async def load_direct(self, name: str, digest: str | None, victim: str | None) -> str | None:
        """A gateway's direct load of an adapter into its engine (adapters.py, EngineAdapters.load_direct);
        the sync it wakes reports it."""
        adapters = self._engine_adapters()
        if adapters is None or self.status.phase != "Ready":
            raise Refused(409, f"shard {self.name} is {self.status.phase}" if adapters is not None else
                          f"shard {self.name}'s engine loads no adapters at runtime")
        try:
            return await adapters.load_direct(self.shard, name, digest, victim)
        finally:
            self.adapters_changed.set()

    async def _sync_adapters(self) -> dict[str, Any]:
        """Its engine's adapters made those placed on its replica (a serving shard of a Model with
        spec.adapters): the status fields saying what the engine holds after (an engine that
        cannot say holds none), and the placement it was synced to (adaptersSeen)."""
        self.adapters_changed.clear()
        adapters = self._engine_adapters()
        if adapters is None:
            return {"adapters": []}
        seen = self.ctx.adapters.placement_seen.get(self.shard.spec.replica, 0)
        try:
            held = await adapters.sync(self.shard, lambda staying: self._set(self.status.phase, adapters=staying))
        except EngineError as err:
            log.warning("shard %s: its engine's adapters: %s", self.name, err)
            return {"adapters": []}
        return {"adapters": held, "adaptersSeen": seen}

    async def _probe(self) -> bool:
        rec = self.record
        if rec is None or rec.probe_kind != "http" or not rec.probe_url:
            return all(p.alive() for p in self.procs)
        try:
            session = await self.ctx.session()
            async with session.get(rec.probe_url) as resp:
                return resp.status == 200
        except (aiohttp.ClientError, asyncio.TimeoutError, OSError):
            return False

    async def _on_exit(self, proc: EngineProcess) -> None:
        code, words = process.exit_description(proc.waiter().result())
        others = [p for p in self.procs if p is not proc]
        # The rest of the shard cannot serve without it; also sweep the exited program's group.
        await self._terminate(self.procs, grace=min(5.0, self.ctx.config.stop_grace_period))
        self.procs = []
        self.ctx.state.remove(self.name)
        self.claim.release()
        tail = process.tail(proc.record.log, self.ctx.config.log_lines)
        message = f"{proc.record.name} (pid {proc.pid}) {words}"
        if others:
            message += f"; stopped {', '.join(p.record.name for p in others)}"
        message += f"; log: {proc.record.log}"
        self._set("Failed", exitCode=code, message=message, logTail=tail)

    async def _on_unhealthy(self, seconds: float) -> None:
        """A shard that served stopped answering its probe (hung, stopped, wedged): its engine is
        stopped (SIGKILL after a short grace reaches a stopped process too) and the shard Failed
        (liveness_timeout), so that the replica is rebuilt instead of sitting unready on its GPUs."""
        assert self.record is not None  # it was Ready: adopted or launched, so recorded
        url = self.record.probe_url
        await self._terminate(self.procs, grace=min(5.0, self.ctx.config.stop_grace_period))
        log_path = self.procs[0].record.log if self.procs else ""
        tail = process.tail(log_path, self.ctx.config.log_lines) if log_path else ""
        self.procs = []
        self.ctx.state.remove(self.name)
        self.claim.release()
        self._set("Failed", message=f"unhealthy: health probe ({url}) failing for {seconds:g}s; engine "
                  f"stopped; log: {log_path}", logTail=tail)

    async def _stop(self, drain: bool) -> None:
        live = [p for p in self.procs if p.has_processes()]
        if live:
            self._set("Stopping", message="")
            if drain and self.ctx.config.drain_delay > 0:
                # The gateway drops the endpoint when it sees the deletion; give it that time.
                await asyncio.sleep(self.ctx.config.drain_delay)
            await self._terminate(live, grace=self.ctx.config.stop_grace_period)
        self.ctx.state.remove(self.name)
        self.claim.release()
        exit_code = self.status.exitCode
        serving = self._serving()
        if serving is not None and serving.child is not None and serving.child.returncode is not None:
            exit_code = process.exit_description(serving.child.returncode)[0]
        self.procs = []
        message = self.status.message if self.status.phase == "Failed" else "engine stopped"
        self._set("Stopped", exitCode=exit_code, message=message)

    async def _terminate(self, procs: list[EngineProcess], grace: float) -> None:
        await terminate(procs, grace, f"shard {self.name}")


async def terminate(procs: list[EngineProcess], grace: float, label: str) -> None:
    """Stop the programs in reverse start order, each gone before the next gets SIGTERM, all
    within `grace`; then SIGKILL what is left. A program that serves through the ones started
    before it (vllm serve on its Ray head) so stops while they still answer it."""
    groups = [p.pid for p in procs]
    loop = asyncio.get_running_loop()
    deadline = loop.time() + grace
    for p in reversed(procs):
        if p.record.term_leader and p.alive():
            with contextlib.suppress(ProcessLookupError):
                os.kill(p.pid, signal.SIGTERM)   # it stops its own children, in their order
            await _until(partial(_gone, p), deadline - loop.time())
        process.signal_group(p.pid, signal.SIGTERM)
        if not await _groups_gone([p], deadline - loop.time()):
            break
    if not any(process.group_members(pgid) for pgid in groups):
        return
    for pgid in groups:
        if process.group_members(pgid):
            log.warning("%s: process group %d outlived the %g s grace period: SIGKILL", label, pgid, grace)
        process.signal_group(pgid, signal.SIGKILL)
    if not await _groups_gone(procs, 10.0):
        log.error("%s: process groups %s survive SIGKILL", label, groups)


def _gone(p: EngineProcess) -> bool:
    return not p.alive()


async def _until(done: Callable[[], bool], timeout: float) -> bool:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not done():
        if loop.time() >= deadline:
            return False
        await asyncio.sleep(0.05)
    return True


async def _groups_gone(procs: list[EngineProcess], timeout: float) -> bool:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        for p in procs:
            if p.child is not None and p.child.returncode is None:
                p.waiter()      # let asyncio reap our children, so they do not linger as zombies
        if not any(process.group_members(p.pid) for p in procs):
            return True
        if loop.time() >= deadline:
            return False
        await asyncio.sleep(0.05)

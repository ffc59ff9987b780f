"""Invariant checkers: pure functions over a History; each returns its violations (empty: it held).

    exclusive_engines      never a GPU or a port claimed by two live engines of a node at once
    surge_bound            never more than replicas + maxSurge replicas of a model (not being deleted,
                           nor replaced by a drain), and never two live replacements of one original
    ready_floor            never fewer Ready than replicas - maxUnavailable inside the given windows
    no_orphans             no engine left without its Shard for longer than a bound
    ready_on_own_engine    no shard reported Ready whose engine then could not bind its serve port
                           (the Ready came from another process's answer on that port)
    ports_free_when_given  no engine found its port taken by another engine of the cluster (a port
                           booked twice), as its bind failure in the shard's log tail says
    no_failed_requests     every request through the gateway succeeded (inside the given windows)
    prompt_requests        every request that started inside the given windows ended within a bound
    no_eviction            no replica on the given nodes evicted or rebuilt as "node lost" after a time
    nodes_stay_ready       no Node written with its Ready condition other than True in a window
    first_rebuild_at_once  the first failure of a streak is rebuilt without a crash-loop delay
    watches_resume         a watch resumed at a revision etcd still holds is not answered 410 Expired
    foreign_port_once      a (node, port) a foreign process listens on is given to one shard at most
    converged              the scenario's settle() reached what it waited for
"""
from __future__ import annotations

from collections import Counter, defaultdict

from llmgw.api import get_condition
from llmgw.api.wellknown import DRAINING_REPLACEMENT_FOR, EVICT
from tests.robustness.history import History

BIND_FAILED = ("cannot bind the serve port", "address already in use")


def _within(t: float, windows: list[tuple[float, float]] | None) -> bool:
    return windows is None or any(a <= t <= b for a, b in windows)


def exclusive_engines(h: History) -> list[str]:
    out, seen = [], set()
    for s in h.samples:
        for what, claims in (("GPU", lambda e: [(e.node, g) for g in e.gpus]),
                             ("port", lambda e: [(e.host, p) for p in e.ports])):
            holders = defaultdict(list)
            for e in s.engines:
                for claim in claims(e):
                    holders[claim].append(e.pid)
            for (where, which), pids in holders.items():
                key = (what, where, which, tuple(sorted(pids)))
                if len(pids) > 1 and key not in seen:
                    seen.add(key)
                    out.append(f"t={s.t:.1f}: {what} {which} on {where} held by live engines {sorted(pids)}")
    return out


def surge_bound(h: History, model: str, replicas: int, max_surge: int) -> list[str]:
    """An original a drain replacement stands in for is not counted: a drain moves a replica
    make-before-break on its own budget (llmgw/api/wellknown.py), one replacement per original,
    so a second live replacement of one original is a violation of its own."""
    out, said = [], set()
    for c, live in h.states("replicas"):
        mine = [r for r in live.values() if r.spec.model == model and r.metadata.deletionTimestamp is None]
        made = defaultdict(list)
        for r in mine:
            if DRAINING_REPLACEMENT_FOR in r.metadata.annotations:
                made[r.metadata.annotations[DRAINING_REPLACEMENT_FOR]].append(r.name)
        for orig, names in made.items():
            if len(names) > 1 and (orig, *names) not in said:
                said.add((orig, *names))
                out.append(f"revision {c.revision}: {len(names)} replacements for {orig} of {model} "
                           f"(a drain makes one): {sorted(names)}")
        mine = [r for r in mine if r.name not in made]
        if len(mine) > replicas + max_surge:
            out.append(f"revision {c.revision}: {len(mine)} replicas of {model} "
                       f"(more than {replicas} + maxSurge {max_surge}): {sorted(r.name for r in mine)}")
    return out


def ready_floor(h: History, model: str, minimum: int, windows: list[tuple[float, float]]) -> list[str]:
    out = []
    for c, live in h.states("replicas"):
        if not _within(c.t, windows):
            continue
        ready = [r.name for r in live.values() if r.spec.model == model
                 and r.status.phase == "Ready" and r.metadata.deletionTimestamp is None]
        if len(ready) < minimum:
            out.append(f"revision {c.revision} (t={c.t:.1f}): {len(ready)} Ready replicas of {model}, "
                       f"fewer than {minimum}")
    return out


def _shard_for(engine, shards: dict) -> bool:
    return any(s.spec.node == engine.node and s.spec.ports.serve in engine.ports for s in shards.values())


def no_orphans(h: History, bound: float) -> list[str]:
    """An engine is an orphan while no Shard (even one being deleted) on its node has its serve port."""
    first: dict[int, float] = {}
    worst: dict[int, tuple[float, object]] = {}
    changes = sorted((c for c in h.changes if c.kind == "shards"), key=lambda c: c.t)
    live: dict[str, object] = {}
    i = 0
    for s in sorted(h.samples, key=lambda s: s.t):
        while i < len(changes) and changes[i].t <= s.t:
            c = changes[i]
            if c.deleted:
                live.pop(c.name, None)
            else:
                live[c.name] = c.obj
            i += 1
        for e in s.engines:
            if _shard_for(e, live):
                first.pop(e.pid, None)
                continue
            since = first.setdefault(e.pid, s.t)
            if s.t - since > worst.get(e.pid, (0.0, None))[0]:
                worst[e.pid] = (s.t - since, e)
    return [f"engine pid {pid} on {e.node} (GPUs {list(e.gpus)}, ports {list(e.ports)}) ran without its "
            f"shard for {age:.0f}s (bound {bound:g}s)" for pid, (age, e) in worst.items() if age > bound]


def ready_on_own_engine(h: History) -> list[str]:
    out, ready = [], set()
    for c in h.ordered("shards"):
        s = c.obj
        key = (s.metadata.uid, s.status.startedAt)
        if s.status.phase == "Ready":
            ready.add(key)
        elif key in ready and _bind_failed(s):
            out.append(f"shard {s.name} on {s.spec.node} was Ready, then its engine could not bind "
                       f"{s.spec.ports.serve}: the Ready answer came from another process")
            ready.discard(key)
    return out


def _bind_failed(shard) -> bool:
    return shard.status.phase == "Failed" and any(
        b in " ".join([shard.status.message, *shard.status.logTail]) for b in BIND_FAILED)


def ports_free_when_given(h: History) -> list[str]:
    foreign = {(a, p) for s in h.samples for a, p, _ in s.foreign}
    out, said = [], set()
    for c in h.ordered("shards"):
        s = c.obj
        where = (h.addresses.get(s.spec.node), s.spec.ports.serve)
        if _bind_failed(s) and where not in foreign and s.metadata.uid not in said:
            said.add(s.metadata.uid)
            out.append(f"shard {s.name} on {s.spec.node} was given port {s.spec.ports.serve}, which another "
                       f"engine held: {s.status.logTail[-1] if s.status.logTail else s.status.message}")
    return out


def no_failed_requests(h: History, windows: list[tuple[float, float]] | None = None,
                       excused: list[tuple[float, float]] = ()) -> list[str]:
    """No request that started inside the windows failed, but for those whose time overlaps an
    `excused` span (a fault with no promise: a stream that started in a promised round and was
    still running when the next round crashed its engine)."""
    failed = [r for r in h.requests if not r.ok and _within(r.start, windows)
              and not any(r.start < b and r.end > a for a, b in excused)]
    if not failed:
        return []
    kinds = Counter(r.detail[:80] for r in failed)
    return [f"{len(failed)} of {len(h.requests)} requests failed; e.g. "
            + "; ".join(f"{n}x {d}" for d, n in kinds.most_common(3))]


def prompt_requests(h: History, windows: list[tuple[float, float]], bound: float) -> list[str]:
    """A request whose response started later than `bound` after it was sent (below the gateway's
    connect timeout; a stream's tokens after its start do not count) picked a replica it could
    not reach: the gateway had not stopped choosing it."""
    def waited(r) -> float:
        return (r.first or r.end) - r.start
    slow = sorted((r for r in h.requests if _within(r.start, windows) and waited(r) > bound),
                  key=lambda r: r.start)
    if not slow:
        return []
    return [f"{len(slow)} requests waited longer than {bound:g}s for a response; e.g. " + "; ".join(
        f"t={r.start:.1f} waited {waited(r):.1f}s ({r.replica or r.detail[:60]})" for r in slow[:3])]


def ended_by(h: History, at: float, by: float) -> list[str]:
    """Every request in flight at `at` ended before `by` (it was not left waiting past a
    promised timeout, e.g. until a partition healed)."""
    late = [r for r in h.requests if r.start < at < r.end and r.end >= by]
    return [f"t={r.start:.1f}: in flight at t={at:.1f}, ended at t={r.end:.1f}, not before t={by:.1f} "
            f"({'stream' if r.streamed else 'whole'}, {r.replica or r.detail[:60]})" for r in late]


def in_flight_bounded(h: History, at: float, bound: float) -> list[str]:
    """Requests in flight at a fault at `at` (issue 45): none waited more than `bound` after it for
    its response to start, nor, a stream started before it, for its end (its tokens, or an error
    event); whole responses all succeeded (retried elsewhere); a stream that failed ended with an
    error event."""
    out = []
    for r in h.requests:
        if not r.start < at < r.end:
            continue
        started = 0 < r.first <= at
        waited = (r.end if started else (r.first or r.end)) - at
        what = f"t={r.start:.1f} ({'stream' if r.streamed else 'whole'}, {r.replica or r.detail[:60]})"
        if waited > bound:
            out.append(f"{what}: in flight at the fault (t={at:.1f}), waited {waited:.1f}s (bound {bound:g}s)")
        if not r.ok and (not r.streamed or not r.detail.startswith("error event")):
            out.append(f"{what}: in flight at the fault, failed: {r.detail[:100]}")
    return out


def no_eviction(h: History, nodes: set[str], after: float = 0.0) -> list[str]:
    out, said = [], set()
    for c in h.ordered("replicas"):
        r = c.obj
        if c.t < after or c.deleted or r.name in said:
            continue
        placed = {p.node for p in r.spec.placement}
        lost = r.status.phase == "Failed" and any(f"node {n} is lost" in r.status.message for n in nodes)
        if (placed & nodes and EVICT in r.metadata.annotations) or lost:
            said.add(r.name)
            out.append(f"t={c.t:.1f}: replica {r.name} on {sorted(placed)} evicted "
                       f"({r.metadata.annotations.get(EVICT) or r.status.message})")
    return out


def nodes_stay_ready(h: History, after: float = 0.0, until: float = float("inf")) -> list[str]:
    out = []
    for c in h.changes:
        if c.kind == "nodes" and not c.deleted and after <= c.t <= until:
            ready = get_condition(c.obj.status.conditions, "Ready")
            if ready is None or ready.status != "True":
                said = f"{ready.status} ({ready.reason}: {ready.message})" if ready else "absent"
                out.append(f"t={c.t:.1f} revision {c.revision}: node {c.name} Ready {said}")
    return out


def first_rebuild_at_once(h: History, slack: float = 1.0) -> list[str]:
    out, said = [], set()
    for c in h.ordered("replicas"):
        st = c.obj.status
        ready = get_condition(st.conditions, "Ready")
        if (st.phase != "Failed" or st.consecutiveFailures != 1 or st.backoffUntil is None
                or ready is None or ready.lastTransitionTime is None):
            continue
        delay = (st.backoffUntil - ready.lastTransitionTime).total_seconds()
        if delay > slack and (c.name, st.restarts) not in said:
            said.add((c.name, st.restarts))
            out.append(f"replica {c.name}: first failure ({st.message}) waits {delay:.0f}s before its rebuild")
    return out


def watches_resume(h: History) -> list[str]:
    return [f"t={w.t:.1f}: a watch resumed at revision {w.revision} through the server was answered "
            f"{w.server}, though etcd still holds that history"
            for w in h.resumes if w.etcd == "events" and w.server != "events"]


def foreign_port_once(h: History) -> list[str]:
    """Each run of a foreign listener's sightings (one squatter's life) gave its port to one shard
    at most (its engine found the port taken, and the agent then lists it in foreignPorts). A
    foreign listener is a run of consecutive samples that see it; a single sighting, or a run
    split from the next by a sample without it, is an engine's socket seen between its end and the
    sampler's look at the processes (the port free again, then reused by a later engine)."""
    runs: list[tuple[tuple[str, int], float, float]] = []
    open_runs: dict[tuple[str, int], list[float]] = {}
    for s in sorted(h.samples, key=lambda s: s.t):
        here = {(addr, port) for addr, port, _inode in s.foreign}
        for key in [k for k in open_runs if k not in here]:
            runs.append((key, *_span(open_runs.pop(key))))
        for key in here:
            open_runs.setdefault(key, []).append(s.t)
    runs += [(key, *_span(ts)) for key, ts in open_runs.items()]
    held: dict[tuple[str, int], list[tuple[float, float]]] = defaultdict(list)
    for key, first, last in runs:
        if last > first:
            held[key].append((first, last))
    # (address, port, first, last) of one holder's run -> the shards given the port then: uid -> name, when
    given: dict[tuple[str, int, float, float], dict[str, str]] = defaultdict(dict)
    seen: set[str] = set()
    for c in h.ordered("shards"):
        s = c.obj
        if s.metadata.uid in seen:     # a port is given when the shard is made, not at its later changes
            continue
        seen.add(s.metadata.uid)
        addr = h.addresses.get(s.spec.node)
        # the ports its engine binds: the dist-init port only on rank 0 of a multi-node replica
        binds = (s.spec.ports.serve, s.spec.ports.distInit if s.spec.rank == 0 and s.spec.worldSize > 1 else None)
        for port in binds:
            for first, last in held.get((addr, port), []):
                if first <= c.t <= last:
                    given[(addr, port, first, last)][s.metadata.uid] = f"{s.name} t={c.t:.1f}"
    return [f"{addr}:{port}, held by a foreign process ({_held_by(h, addr, port, first, last)}) at "
            f"t={first:.1f}-{last:.1f}, was given to {len(shards)} shards: {', '.join(shards.values())}"
            for (addr, port, first, last), shards in given.items() if len(shards) > 1]


def _held_by(h: History, addr: str, port: int, first: float, last: float) -> str:
    inodes = {i for s in h.samples if first <= s.t <= last for a, p, i in s.foreign if (a, p) == (addr, port)}
    seen = sorted({who.splitlines()[0] for s in h.samples if first <= s.t <= last
                   for i, who in s.holders if i in inodes})
    return "; ".join(seen[:3]) or "holder not seen"


def _span(ts: list[float]) -> tuple[float, float]:
    return ts[0], ts[-1]


def converged(h: History) -> list[str]:
    return [f"never settled: {what}" for what in h.unconverged]

"""The recorder: every model/replica/shard/node change from etcd's watch, and engine samples from /proc.

    rec = Recorder(store, cluster_dir, history, ports)   # ports: the agents' engine port range
    await rec.start()      # lists, then watches from the list's revision; the sampler thread starts
    ...
    await rec.stop()

Engines are found by the cluster's marker in their environment (llmgw.dev.cluster) and
`-m llmgw.sim` in their argv; each sample holds every engine's node, GPUs
(CUDA_VISIBLE_DEVICES), declared ports (--port, and the --dist-init-addr port on rank 0)
and the sockets it listens on (/proc/<pid>/net/tcp, its node's network namespace, matched
with its fds), plus the listeners on the nodes' addresses in the agents' engine port range
(`ports`, the cluster's slot's `--port-range`) that no engine owns (a foreign process).

etcd restored from a snapshot under the recorder (its revision back, or its cluster id new:
llmgw.store.errors.Restored) is listed again: every object it holds is recorded, and each one
recorded before that it lacks is recorded deleted; from then on the kind's revisions are
recorded above the last one before (etcd's revision plus that), so they still sort in order.
"""
from __future__ import annotations

import asyncio
import os
import threading
import time
from pathlib import Path

from llmgw.api import KINDS as API_KINDS
from llmgw.dev.cluster import MARKER, NODE_MARKER
from llmgw.store import Compacted, StoreUnavailable
from llmgw.store.errors import Restored
from llmgw.store.etcd import Lineage
from tests.robustness.history import Change, Engine, History, Sample

KINDS = ("models", "replicas", "shards", "nodes")


class Recorder:
    def __init__(self, store, cluster_dir: Path, history: History, ports: range, interval: float = 0.1):
        self.store, self.history, self.ports, self.interval = store, history, ports, interval
        self.addresses = set(history.addresses.values())
        self.marker = f"{MARKER}={Path(cluster_dir).resolve()}".encode()
        self._known: dict[str, dict[str, object]] = {}   # kind -> name -> the object as last recorded
        self._base: dict[str, int] = {}    # kind -> what its revisions are recorded above (after a restore)
        self._tasks: list[asyncio.Task] = []
        self._halt = threading.Event()
        self._thread = threading.Thread(target=self._sample_loop, daemon=True, name="engine-sampler")

    async def start(self) -> "Recorder":
        for kind in KINDS:
            items, rev = await self.store.list(API_KINDS[kind])
            now = time.monotonic()
            self.history.changes += [Change(now, o.revision or rev, kind, o.name, o) for o in items]
            self._known[kind] = {o.name: o for o in items}
            self._tasks.append(asyncio.create_task(self._watch(kind, rev + 1)))
        self._thread.start()
        return self

    async def stop(self) -> None:
        self._halt.set()
        for t in self._tasks:
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await asyncio.to_thread(self._thread.join)

    async def _watch(self, kind: str, start: int) -> None:
        lineage = Lineage()
        while True:
            try:
                if start == 0:
                    start = await self._relist(kind) + 1
                async for ev in self.store.watch(API_KINDS[kind], from_revision=start, lineage=lineage):
                    self._record(kind, ev.revision, ev.object, ev.type == "DELETED")
                    start = ev.revision + 1
            except StoreUnavailable:     # an etcd member went away: watch again from where we were
                await asyncio.sleep(0.2)
            except Restored:             # etcd restored from a snapshot (a nemesis): list what it holds
                self._base[kind] = max((c.revision for c in self.history.changes if c.kind == kind), default=0)
                start = 0
            except Compacted as err:
                raise AssertionError(f"the recorder lost {kind} history: compacted at {err}") from None

    def _record(self, kind: str, revision: int, obj, deleted: bool) -> None:
        """A change; its revision above every one recorded before a restore, so the kind's
        changes still sort in the order they happened."""
        self.history.changes.append(Change(time.monotonic(), self._base.get(kind, 0) + revision, kind, obj.name,
                                           obj, deleted=deleted))
        known = self._known[kind]
        if deleted:
            known.pop(obj.name, None)
        else:
            known[obj.name] = obj

    async def _relist(self, kind: str) -> int:
        """The restored etcd's objects of `kind` as changes: each one it holds, and a deletion of
        each one recorded that it lacks; its revision."""
        items, rev = await self.store.list(API_KINDS[kind])
        held = {o.name for o in items}
        for gone in [o for name, o in self._known[kind].items() if name not in held]:
            self._record(kind, rev, gone, deleted=True)
        for o in items:
            self._record(kind, rev, o, deleted=False)
        return rev

    # ------------------------------------------------------------------ /proc
    def _sample_loop(self) -> None:
        while not self._halt.wait(self.interval):
            try:
                self.history.samples.append(self.sample())
            except Exception as err:  # noqa: BLE001 - a sampler bug must show, not end the sampling quietly
                self.history.unconverged.append(f"sampler error: {err!r}")
                return

    def sample(self) -> Sample:
        marked = list(_marked_processes(self.marker))
        listeners = _listeners([pid for pid, _, _ in marked])
        engines, owned = [], set()
        for pid, argv, env in marked:
            if not _is_engine(argv):
                continue
            inodes = _socket_inodes(pid)
            owned |= inodes
            engines.append(Engine(
                pid=pid, node=env.get(NODE_MARKER, "?"), host=_arg(argv, "--host") or "?",
                gpus=tuple(int(g) for g in env.get("CUDA_VISIBLE_DEVICES", "").split(",") if g),
                ports=_declared_ports(argv),
                listening=tuple(sorted(listeners[i] for i in inodes if i in listeners)),
                stopped=_state(pid) == "T"))
        foreign = tuple(sorted((a, p, i) for i, (a, p) in listeners.items()
                               if i not in owned and a in self.addresses and p in self.ports))
        return Sample(time.monotonic(), tuple(e for e in engines if _state(e.pid) not in ("Z", "")), foreign,
                      _holders({i for _, _, i in foreign}) if foreign else ())


def _is_engine(argv: list[str]) -> bool:
    """`<python> -m llmgw.sim ...` or `<...>/llmgw sim ...` (how the agent runs the sim engine)."""
    return "llmgw.sim" in argv or any(a.endswith("llmgw") and b == "sim" for a, b in zip(argv, argv[1:], strict=False))


def _arg(argv: list[str], flag: str) -> str | None:
    return argv[argv.index(flag) + 1] if flag in argv and argv.index(flag) + 1 < len(argv) else None


def _declared_ports(argv: list[str]) -> tuple[int, ...]:
    ports = [int(_arg(argv, "--port") or 0)]
    if _arg(argv, "--rank") in (None, "0") and int(_arg(argv, "--world-size") or 1) > 1:
        ports.append(int((_arg(argv, "--dist-init-addr") or ":0").rsplit(":", 1)[1]))
    return tuple(p for p in ports if p)


def _marked_processes(marker: bytes):
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/environ", "rb") as f:
                raw = f.read()
            if marker not in raw:
                continue
            with open(f"/proc/{entry.name}/cmdline", "rb") as f:
                argv = [a.decode(errors="replace") for a in f.read().split(b"\0") if a]
        except OSError:
            continue
        env = dict(kv.decode(errors="replace").partition("=")[::2] for kv in raw.split(b"\0") if b"=" in kv)
        yield int(entry.name), argv, env


def _state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(") ", 1)[1][:1]
    except (OSError, IndexError):
        return ""


def _holders(inodes: set[int]) -> tuple[tuple[int, str], ...]:
    """Who holds each socket of `inodes`, among every process: (inode, "pid command"); rare (foreign
    listeners only), so a scan of all of /proc is affordable."""
    out = []
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            for inode in _socket_inodes(int(entry.name)) & inodes:
                try:
                    cmd = Path(f"/proc/{entry.name}/cmdline").read_bytes().replace(b"\0", b" ").decode()[:120]
                except OSError:
                    cmd = "?"
                out.append((inode, f"{entry.name} {cmd}"))
    return tuple(sorted(out))


def _socket_inodes(pid: int) -> set[int]:
    out = set()
    try:
        for fd in os.scandir(f"/proc/{pid}/fd"):
            try:
                target = os.readlink(fd.path)
            except OSError:
                continue
            if target.startswith("socket:["):
                out.add(int(target[8:-1]))
    except OSError:
        pass
    return out


def _listeners(pids: list[int]) -> dict[int, tuple[str, int]]:
    """inode -> (IPv4 address, port) of every listening TCP socket in the network namespaces of
    this process and of `pids` (a node's: its agent, engines and squatters); each namespace's
    table read once, through one of its processes."""
    tables = {_netns("self"): "/proc/self/net/tcp"}
    for pid in pids:
        tables.setdefault(_netns(str(pid)), f"/proc/{pid}/net/tcp")
    out: dict[int, tuple[str, int]] = {}
    for path in tables.values():
        out |= _listening(path)
    return out


def _netns(pid: str) -> str:
    try:
        return os.readlink(f"/proc/{pid}/ns/net")
    except OSError:
        return ""


def _listening(path: str) -> dict[int, tuple[str, int]]:
    out: dict[int, tuple[str, int]] = {}
    try:
        lines = Path(path).read_text().splitlines()[1:]
    except OSError:
        return out
    for line in lines:
        cols = line.split()
        if len(cols) < 10 or cols[3] != "0A":     # 0A: LISTEN
            continue
        hexaddr, hexport = cols[1].split(":")
        addr = ".".join(str(b) for b in bytes.fromhex(hexaddr)[::-1])
        out[int(cols[9])] = (addr, int(hexport, 16))
    return out

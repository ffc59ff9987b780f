"""Snapshots of etcd in llmgw's files: etcd's maintenance snapshot, behind a header that says what it is.

A file is two lines of header, then etcd's own snapshot bytes (the payload, what
``etcdctl snapshot save`` writes: bbolt's database with etcd's sha256 at its end)::

    llmgw-snapshot 1
    {"created": "...", "llmgw": "0.2.0", "revision": 42, "sha256": "...", "size": 20512}
    <size bytes of etcd's snapshot>

The header is checked before anything reads the payload (``open_snapshot``): a file
that is not one, whose header is broken, that is shorter or longer than its header
says, or whose payload's sha256 differs, is refused with one line naming what is
wrong (``SnapshotError``). Stripped of the header the payload is what etcdctl (and
etcdutl) restore. ``save`` writes atomically: a temporary file beside the target,
fsync'd, renamed over it, the directory fsync'd; a failure leaves no file behind.

The revision is not in etcd's snapshot stream (its messages carry no header): it is
read from the payload with ``etcdctl snapshot status``, so it is the snapshot's own.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import tempfile
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import IO, Any

from aetcd import rpc

from llmgw.store import keys as K
from llmgw.store.connection import Connection
from llmgw.store.etcd import Etcd

MAGIC = b"llmgw-snapshot 1\n"
HEADER_LIMIT = 4096      # bytes of the header's second line, at most
CHUNK = 1 << 20
SNAPSHOT_TIMEOUT = 600.0  # seconds etcd gets to stream its snapshot


class SnapshotError(Exception):
    """A snapshot file or restore refused: the message is one line naming what is wrong."""


@dataclass(frozen=True)
class Header:
    revision: int   # etcd's revision in the snapshot
    size: int       # bytes of etcd's snapshot after the header
    sha256: str     # of those bytes
    llmgw: str      # the version of llmgw that saved it
    created: str    # when (UTC, ISO 8601)

    def encode(self) -> bytes:
        return MAGIC + json.dumps(asdict(self), sort_keys=True).encode() + b"\n"


@dataclass(frozen=True)
class Snapshot:
    """A checked snapshot file: its header and where its payload starts."""
    path: Path
    header: Header
    offset: int

    def copy_payload(self, out: IO[bytes]) -> None:
        with self.path.open("rb") as f:
            f.seek(self.offset)
            shutil.copyfileobj(f, out, CHUNK)


def etcdctl() -> str:
    path = shutil.which("etcdctl")
    if not path:
        raise SnapshotError("executable file not found: etcdctl (install Debian's etcd-client package)")
    return path


def _etcdctl(*args: str) -> str:
    out = subprocess.run([etcdctl(), *args], capture_output=True, text=True, env={**os.environ, "ETCDCTL_API": "3"})
    if out.returncode != 0:
        lines = (out.stderr or out.stdout).strip().splitlines() or [f"exit status {out.returncode}"]
        raise SnapshotError(f"etcdctl {args[0]} {args[1]}: {lines[-1]}")
    return out.stdout


async def stream(conn: Connection, out: IO[bytes]) -> tuple[int, str]:
    """etcd's maintenance snapshot into out: its size and sha256."""
    async def pull(client: Any) -> tuple[int, str]:
        out.seek(0)            # from the start again where a dropped stream is tried on another endpoint
        out.truncate()
        digest, size = hashlib.sha256(), 0
        async for msg in client.maintenancestub.Snapshot(rpc.SnapshotRequest(), timeout=SNAPSHOT_TIMEOUT,
                                                         metadata=client.metadata):
            out.write(msg.blob)
            digest.update(msg.blob)
            size += len(msg.blob)
        return size, digest.hexdigest()

    return await conn.call(pull)


def payload_revision(payload: Path) -> int:
    """The revision of an etcd snapshot, read from it by `etcdctl snapshot status`."""
    revision: int = json.loads(_etcdctl("snapshot", "status", str(payload), "-w", "json"))["revision"]
    return revision


@contextmanager
def _temporary_beside(path: Path, suffix: str) -> Iterator[tuple[IO[bytes], Path]]:
    """A new file in path's directory, removed on leaving unless renamed away."""
    fd, name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=suffix, dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            yield f, Path(name)
    finally:
        Path(name).unlink(missing_ok=True)


def _sync(f: IO[bytes]) -> None:
    f.flush()
    os.fsync(f.fileno())


def save(path: Path, version: str, pull: Callable[[IO[bytes]], tuple[int, str]]) -> Header:
    """etcd's snapshot into path, atomically, behind its header; pull writes it into a file
    (``stream`` through a connection) and says its size and sha256."""
    path = path.absolute()
    with _temporary_beside(path, ".etcd") as (payload, payload_path):
        size, sha256 = pull(payload)
        _sync(payload)
        header = Header(payload_revision(payload_path), size, sha256, version,
                        datetime.now(timezone.utc).isoformat(timespec="seconds"))
        with _temporary_beside(path, ".tmp") as (out, out_path):
            out.write(header.encode())
            with payload_path.open("rb") as f:
                shutil.copyfileobj(f, out, CHUNK)
            _sync(out)
            os.replace(out_path, path)
    directory = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(directory)
    finally:
        os.close(directory)
    return header


def _header(path: Path, first: bytes, second: bytes) -> Header:
    if first != MAGIC:
        raise SnapshotError(f"{path}: not an llmgw snapshot (it does not begin with {MAGIC.strip().decode()!r})")
    if not second.endswith(b"\n"):
        raise SnapshotError(f"{path}: truncated or broken header (no end of line in its first "
                            f"{HEADER_LIMIT} bytes)")
    try:
        fields = json.loads(second)
        header = Header(**fields)
    except (ValueError, TypeError) as err:
        raise SnapshotError(f"{path}: broken header: {str(err).splitlines()[0]}") from None
    if not (isinstance(header.size, int) and isinstance(header.revision, int) and isinstance(header.sha256, str)):
        raise SnapshotError(f"{path}: broken header: size and revision must be numbers, sha256 a string")
    return header


def open_snapshot(path: Path) -> Snapshot:
    """The checked snapshot file at path: header, size and sha256; SnapshotError otherwise."""
    digest = hashlib.sha256()
    with path.open("rb") as f:
        header = _header(path, f.readline(len(MAGIC)), f.readline(HEADER_LIMIT))
        offset = f.tell()
        held = path.stat().st_size - offset
        if held != header.size:
            what = "truncated" if held < header.size else "too long"
            raise SnapshotError(f"{path}: {what}: its header records {header.size} bytes of etcd snapshot, "
                                f"the file holds {held}")
        while chunk := f.read(CHUNK):
            digest.update(chunk)
    if digest.hexdigest() != header.sha256:
        raise SnapshotError(f"{path}: corrupt: the etcd snapshot's sha256 is {digest.hexdigest()}, "
                            f"its header records {header.sha256}")
    return Snapshot(path, header, offset)


def restore(snapshot: Snapshot, data_dir: Path, member: dict[str, str]) -> None:
    """etcdctl's restore of the snapshot's payload into a new data_dir; member: etcdctl's restore
    flags by name (name, initial-cluster, initial-advertise-peer-urls, initial-cluster-token)."""
    if data_dir.exists():
        raise SnapshotError(f"--data-dir {data_dir} exists: etcd restores into a new directory only")
    if not data_dir.parent.is_dir():
        raise SnapshotError(f"--data-dir {data_dir}: {data_dir.parent} is not a directory")
    flags = [f"--{flag}={value}" for flag, value in member.items()]
    # beside data_dir, renamed into place once whole: a failed restore leaves no data directory
    with tempfile.TemporaryDirectory(prefix=f".{data_dir.name}.", dir=data_dir.parent) as tmp:
        payload, restored = Path(tmp) / "etcd.snapshot", Path(tmp) / "data"
        with payload.open("wb") as out:
            snapshot.copy_payload(out)
        _etcdctl("snapshot", "restore", str(payload), f"--data-dir={restored}", *flags)
        os.replace(restored, data_dir)


async def census(conn: Connection) -> tuple[int, dict[str, int]]:
    """etcd's revision, and how many objects of each kind it holds (their specs), with the
    revoked certificates as "revocations"."""
    etcd = Etcd.open(conn, batch_writes=False)
    resp = await etcd.range(K.ROOT + "/", K.prefix_end(K.ROOT + "/"), keys_only=True)
    counts: Counter[str] = Counter()
    for kv in resp.kvs:
        key = kv.key.decode()
        parsed = K.parse_object_key(key)
        if parsed is not None and parsed[0] == K.SPEC:
            counts[parsed[1]] += 1
        elif key.startswith(K.REVOKED):
            counts["revocations"] += 1
    revision: int = resp.header.revision
    return revision, dict(sorted(counts.items()))

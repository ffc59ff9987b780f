"""The agent's node-local weights cache: content-addressed, within a size budget, LRU-evicted.

    <dir>/models/<hex>/      a model's verified files, read-only; named by its content digest
                             (sha256:<hex>, digest.py); there only once complete (renamed in whole)
    <dir>/partial/<hash>     files being fetched, by expected hash (fetch.py): kept to resume
    <dir>/staging/<tmp>/     a model's tree being assembled; emptied at start, never used
    <dir>/resolved/<key>     a source's digest once pulled (a hub commit names no digest of its own),
                             then the source on a second line (what peers look for)

A model's last use is its directory's mtime. Room for a pull is made by evicting, least recently
used first, partial files no pull is writing and then models no shard of this node uses (a pinned
digest); what cannot be made is CacheFull. The budget counts what is on disk plus what running
pulls have yet to write. status() is what the Node reports: the digests held (for placement to
prefer them) and the room left.
"""
from __future__ import annotations

import hashlib
import logging
import os
import shutil
import tempfile
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from llmgw.api import CachedWeights, WeightsCache
from llmgw.weights.errors import PullError

log = logging.getLogger(__name__)


@dataclass
class Reservation:
    """Room a running pull holds: `total` bytes, `done` of them on disk already."""
    total: int
    partials: set[str] = field(default_factory=set)    # its partial files' names, not to evict
    done: int = 0

    @property
    def outstanding(self) -> int:
        return max(0, self.total - self.done)


def _hex(digest: str) -> str:
    return digest.removeprefix("sha256:")


def _size(path: Path) -> int:
    if path.is_file():
        return path.stat().st_size
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file() and not p.is_symlink())


class Cache:
    def __init__(self, root: str | os.PathLike[str], capacity: int | None = None) -> None:
        self.root = Path(root)
        self.capacity = capacity           # None: as much as the disk holds
        self.models = self.root / "models"
        self.partials = self.root / "partial"
        self.staging = self.root / "staging"
        self.resolved = self.root / "resolved"
        self.pins: Counter[str] = Counter()
        self.reservations: list[Reservation] = []
        self._sizes: dict[str, int] = {}
        self._sources: dict[str, set[str]] = {}     # digest -> the sources resolved to it

    def open(self) -> None:
        try:
            for d in (self.models, self.partials, self.staging, self.resolved):
                d.mkdir(parents=True, exist_ok=True)
        except OSError as err:
            raise OSError(f"cannot create the weights cache {self.root}: {err.strerror or err}") from None
        for leftover in self.staging.iterdir():     # an agent stopped mid-assembly: never used
            shutil.rmtree(leftover, ignore_errors=True)
        self._sizes = {"sha256:" + d.name: _size(d) for d in self.models.iterdir() if d.is_dir()}
        for f in self.resolved.iterdir():
            if not f.name.startswith("."):
                digest, _, source = f.read_text().partition("\n")
                self._sources.setdefault(digest.strip(), set()).add(source.strip())

    # ------------------------------------------------------------ lookups
    def path(self, digest: str) -> Path:
        return self.models / _hex(digest)

    def has(self, digest: str) -> bool:
        return digest in self._sizes

    def digest_of(self, source: str) -> str | None:
        """The digest `source` (a listing's key) was pulled as, if it is still held."""
        try:
            digest = (self.resolved / _key(source)).read_text().partition("\n")[0].strip()
        except FileNotFoundError:
            return None
        return digest if self.has(digest) else None

    def touch(self, digest: str) -> None:
        os.utime(self.path(digest))

    def take(self, digest: str) -> Path | None:
        """The cached tree of `digest`, touched (used now: the last to be evicted), or None if not held."""
        if not self.has(digest):
            return None
        self.touch(digest)
        return self.path(digest)

    # -------------------------------------------------------------- pins
    def pin(self, digest: str) -> None:
        """A shard of this node uses `digest`: it is not evicted until unpinned."""
        self.pins[digest] += 1

    def unpin(self, digest: str) -> None:
        self.pins[digest] -= 1
        if self.pins[digest] <= 0:
            del self.pins[digest]

    # -------------------------------------------------------------- room
    def used(self) -> int:
        on_disk = sum(self._sizes.values()) + _size(self.partials) + _size(self.staging)
        return on_disk + sum(r.outstanding for r in self.reservations)

    def free(self) -> int:
        disk = shutil.disk_usage(self.root).free - sum(r.outstanding for r in self.reservations)
        if self.capacity is None:
            return max(0, disk)
        return max(0, min(disk, self.capacity - self.used()))

    def reserve(self, total: int, partials: set[str], what: str) -> Reservation:
        """Room for a pull of `total` bytes (less what its partial files hold), evicting what no
        shard uses; CacheFull when that is not enough."""
        held = sum((self.partials / p).stat().st_size for p in partials if (self.partials / p).exists())
        need = total - held
        if self.free() < need:
            self._evict(need, partials)
        if self.free() < need:
            used = ", ".join(sorted(self.pins)) or "none"
            capacity = "the disk's" if self.capacity is None else f"{self.capacity} bytes"
            raise PullError("CacheFull", f"{what} needs {need} bytes; the cache at {self.root} has {self.free()} "
                            f"free (capacity {capacity}), and the weights in use by this node's shards "
                            f"cannot be evicted: {used}")
        r = Reservation(total, set(partials), held)
        self.reservations.append(r)
        return r

    def release(self, r: Reservation) -> None:
        self.reservations.remove(r)

    def _evict(self, need: int, keep: set[str]) -> None:
        writing = keep.union(*(r.partials for r in self.reservations))
        for part in sorted(self.partials.iterdir(), key=lambda p: p.stat().st_mtime):
            if self.free() >= need:
                return
            if part.name not in writing:
                log.info("weights cache: dropping the partial download %s", part.name)
                part.unlink(missing_ok=True)
        unused = [d for d in self._sizes if d not in self.pins]
        for digest in sorted(unused, key=lambda d: self.path(d).stat().st_mtime):
            if self.free() >= need:
                return
            log.info("weights cache: evicting %s (%d bytes), used by no shard of this node",
                     digest, self._sizes[digest])
            gone = self.staging / f"evicted-{_hex(digest)}"
            os.rename(self.path(digest), gone)      # out of models/ at once, then removed
            del self._sizes[digest]
            _remove_tree(gone)

    # ------------------------------------------------------------ commit
    def new_staging(self) -> Path:
        return Path(tempfile.mkdtemp(dir=self.staging))

    def commit(self, tree: Path, digest: str, source: str) -> Path:
        """Make the verified tree `tree` the model `digest`, read-only, in one rename."""
        for p in tree.rglob("*"):
            if p.is_file():
                p.chmod(0o444)
        target = self.path(digest)
        if target.exists():             # another pull of the same content won
            _remove_tree(tree)
        else:
            os.rename(tree, target)
        self._sizes[digest] = _size(target)
        tmp = self.resolved / f".{_key(source)}.tmp"
        tmp.write_text(f"{digest}\n{source}")
        os.rename(tmp, self.resolved / _key(source))
        self._sources.setdefault(digest, set()).add(source)
        return target

    # ------------------------------------------------------------ report
    def status(self) -> WeightsCache:
        capacity = self.capacity if self.capacity is not None else self.used() + self.free()
        return WeightsCache(capacityBytes=capacity, freeBytes=self.free(),
                            models=[CachedWeights(digest=d, bytes=n, sources=self._sources_of(d))
                                    for d, n in sorted(self._sizes.items())])

    def _sources_of(self, digest: str) -> list[str]:
        """The sources resolved to `digest` that are not the digest itself (a manifest's)."""
        return sorted(self._sources.get(digest, set()) - {digest, ""})


def _key(source: str) -> str:
    return hashlib.sha256(source.encode()).hexdigest()


def _remove_tree(tree: Path) -> None:
    shutil.rmtree(tree, ignore_errors=True)     # its files are read-only, its directories are not

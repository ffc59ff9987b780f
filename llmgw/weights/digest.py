"""A model's content digest, and the checks of one file's bytes.

The digest is `sha256:` of the sorted lines `<sha256> <size> <path>\n`, one per file: the same
content has the same digest whichever origin served it (a hub, an HTTP origin, later a peer), which
is what nodes and the scheduler compare and what a Model pins (spec.digest).
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import PurePosixPath


@dataclass(frozen=True)
class FileEntry:
    """One file of a model: where it goes in the model's directory and how its bytes are checked:
    by sha256, or (a hub file outside LFS, which the hub names by its git blob id) by git's sha1."""
    path: str
    size: int
    url: str
    sha256: str | None = None
    git_sha1: str | None = None

    @property
    def key(self) -> str:
        """The name its partial download is kept under: its expected content, whatever the origin."""
        return f"sha256-{self.sha256}" if self.sha256 else f"gitsha1-{self.git_sha1}"


def content_digest(files: list[tuple[str, int, str]]) -> str:
    """The digest of (path, size, sha256) triples."""
    lines = "".join(f"{sha} {size} {path}\n" for path, size, sha in sorted(files))
    return "sha256:" + hashlib.sha256(lines.encode()).hexdigest()


def check_path(path: str) -> str:
    """A file's place in a model directory: relative, no '..', nothing a line or a shell splits."""
    p = PurePosixPath(path)
    if (not path or p.is_absolute() or any(part in ("", ".", "..") for part in path.split("/"))
            or any(c in path for c in "\n\r\0\\")):
        raise ValueError(f"{path!r} is not a relative path inside the model's directory")
    return path


class Hashes:
    """The running hashes of one file as its bytes arrive: sha256 always, git's blob sha1 when the
    listing names the file by it (the object header first: `blob <size>\\0`)."""

    def __init__(self, entry: FileEntry) -> None:
        self.entry = entry
        self.sha256 = hashlib.sha256()
        self.git = hashlib.sha1(f"blob {entry.size}\0".encode(), usedforsecurity=False) if entry.git_sha1 else None

    def update(self, chunk: bytes) -> None:
        self.sha256.update(chunk)
        if self.git is not None:
            self.git.update(chunk)

    def mismatch(self) -> str | None:
        """What differs from the listing, or None."""
        e = self.entry
        if e.sha256 is not None and self.sha256.hexdigest() != e.sha256:
            return f"{e.path}: sha256 {self.sha256.hexdigest()}, the listing says {e.sha256}"
        if e.git_sha1 is not None and self.git is not None and self.git.hexdigest() != e.git_sha1:
            return f"{e.path}: git blob id {self.git.hexdigest()}, the listing says {e.git_sha1}"
        return None

"""Why a pull failed: one exception, its reason a word the shard's condition carries."""
from __future__ import annotations

from typing import Literal

Reason = Literal[
    "OriginUnreachable",   # no answer, or a server error, from the hub or the HTTP origin
    "SourceNotFound",      # the origin answered: no such repository, revision, manifest or file
    "BadManifest",         # the origin's listing is not one llmgw can use (a path, a size, a hash)
    "ChecksumMismatch",    # a file's bytes are not the ones its listing names
    "DigestMismatch",      # the content is not the Model's pinned spec.digest
    "CacheFull",           # the cache cannot hold it without evicting weights a shard uses
]


class PullError(Exception):
    def __init__(self, reason: Reason, message: str) -> None:
        super().__init__(message)
        self.reason: Reason = reason
        self.message = message

    def __str__(self) -> str:
        return f"{self.reason}: {self.message}"

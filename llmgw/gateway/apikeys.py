"""Bearer API keys from a file: one key per line, re-read when the file changes.

Blank lines and lines starting with '#' are ignored. The file is stat'ed on
each check (a cheap syscall) and re-read when its mtime, size or inode moves;
if it disappears or cannot be read, the keys last loaded stay in force. One of the two
`Authenticator`s (auth.py): a valid key has no ApiKey object, hence no scope or limits.
"""
from __future__ import annotations

import hashlib
import logging
import os
from typing import Literal

from llmgw.gateway.auth import INCORRECT, MALFORMED, MISSING, bearer_token

log = logging.getLogger(__name__)


def _digest(key: str) -> bytes:
    # Keys are kept and compared as digests: a set lookup on a digest does not
    # leak, by its timing, how much of a guessed key was right.
    return hashlib.sha256(key.encode()).digest()


class ApiKeys:
    def __init__(self, path: str):
        self.path = path
        self._stamp: tuple[int, int, int] | None = None
        self._keys: frozenset[bytes] = frozenset()
        self.reload_if_changed(required=True)

    def __len__(self) -> int:
        return len(self._keys)

    def reload_if_changed(self, required: bool = False) -> bool:
        try:
            st = os.stat(self.path)
            stamp = (st.st_mtime_ns, st.st_size, st.st_ino)
            if stamp == self._stamp:
                return False
            with open(self.path, encoding="utf-8") as f:
                lines = f.read().splitlines()
        except OSError as err:
            if required:
                raise
            if self._stamp is not None:
                log.warning("api keys file %s unreadable (%s); keeping the %d keys loaded before",
                            self.path, err, len(self._keys))
                self._stamp = None
            return False
        keys = {ln.strip() for ln in lines}
        self._keys = frozenset(_digest(k) for k in keys if k and not k.startswith("#"))
        self._stamp = stamp
        log.info("loaded %d api keys from %s", len(self._keys), self.path)
        return True

    def check_now(self, authorization: bytes | None) -> Literal[True] | str:
        """True when the header carries a valid key, else why not (for the 401)."""
        self.reload_if_changed()
        if not authorization:
            return MISSING
        token = bearer_token(authorization)
        if token is None:
            return MALFORMED
        if _digest(token) not in self._keys:
            return INCORRECT
        return True

    async def check(self, authorization: bytes | None) -> Literal[True] | str:
        return self.check_now(authorization)

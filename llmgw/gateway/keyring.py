"""The ApiKey objects a gateway authenticates bearer keys against (docs/gateway.md, "API keys").

Fed by the server's watch of apikeys (source.py), as the routing table is. A presented secret
names its key (`llmgw_<name>_<random>`, llmgw/api/secrets.py), so one object is looked up and
its salted scrypt hash checked, in a worker thread (the KDF takes tens of milliseconds), at most
`kdf_threads` at a time. What was verified is remembered, as the SHA-256 of the Authorization
header that carried it (a lookup by digest: its timing tells nothing of how much of a guess was
right), until the key's hash changes or the key goes, so a request pays a hash and a dict lookup,
not a KDF. A key deleted, or past its `expires`, is refused from then on, and `on_revoked(name)`
is called so its requests in flight are ended (admission.py). One of the two `Authenticator`s
(auth.py).
"""
from __future__ import annotations

import asyncio
import hashlib
import logging
import time
from collections.abc import Callable

from llmgw.api import ApiKey
from llmgw.api.secrets import key_name, verify_secret
from llmgw.gateway.auth import INCORRECT, MALFORMED, MISSING, bearer_token

log = logging.getLogger(__name__)

# A timer further out than this is re-armed when it fires: call_at far in the future is fine,
# but a clock that jumps should not leave a key alive long past its expiry.
_MAX_TIMER = 3600.0


class KeyRing:
    def __init__(self, on_revoked: Callable[[str], None] = lambda name: None, kdf_threads: int = 2) -> None:
        self.on_revoked = on_revoked
        self._keys: dict[str, ApiKey] = {}
        self._expires: dict[str, float] = {}               # name -> expiry (time.time()), for those that expire
        # SHA-256 of a verified Authorization header -> (the key's name, the secretHash it was verified by)
        self._verified: dict[bytes, tuple[str, str]] = {}
        self._headers: dict[str, set[bytes]] = {}          # name -> the digests verified for it
        self._timers: dict[str, asyncio.TimerHandle] = {}
        self._kdf = asyncio.Semaphore(kdf_threads)

    def __len__(self) -> int:
        return len(self._keys)

    # ------------------------------------------------------------ the watch

    def apply(self, type_: str, key: ApiKey) -> bool:
        """One watch event of an ApiKey; always True (a key changes no routing, but is news)."""
        name = key.name
        if type_ == "DELETED":
            self._forget(name)
            return True
        old = self._keys.get(name)
        self._keys[name] = key
        if old is not None and old.spec.secretHash != key.spec.secretHash:
            self._unverify(name)
        self._arm(name, key)
        return True

    def replace(self, keys: list[ApiKey]) -> None:
        """Make the ring exactly `keys` (a full list: a relist, a test)."""
        for name in set(self._keys) - {k.name for k in keys}:
            self._forget(name)
        for k in keys:
            self.apply("MODIFIED", k)

    def get(self, name: str) -> ApiKey | None:
        return self._keys.get(name)

    def _forget(self, name: str) -> None:
        if self._keys.pop(name, None) is None:
            return
        self._unverify(name)
        self._expires.pop(name, None)
        timer = self._timers.pop(name, None)
        if timer is not None:
            timer.cancel()
        log.info("api key %s deleted: refused from now on", name)
        self.on_revoked(name)

    def _unverify(self, name: str) -> None:
        for digest in self._headers.pop(name, ()):
            self._verified.pop(digest, None)

    def _arm(self, name: str, key: ApiKey) -> None:
        timer = self._timers.pop(name, None)
        if timer is not None:
            timer.cancel()
        if key.spec.expires is None:
            self._expires.pop(name, None)
            return
        at = self._expires[name] = key.spec.expires.timestamp()
        delay = at - time.time()
        if delay <= 0:
            self.on_revoked(name)
            return
        self._timers[name] = asyncio.get_running_loop().call_later(min(delay, _MAX_TIMER), self._expiry, name)

    def _expiry(self, name: str) -> None:
        self._timers.pop(name, None)
        key = self._keys.get(name)
        if key is None:
            return
        if time.time() < self._expires.get(name, 0.0):   # armed for _MAX_TIMER: not yet
            return self._arm(name, key)
        log.info("api key %s expired: refused from now on", name)
        self.on_revoked(name)

    # ------------------------------------------------------------ authentication

    def check_now(self, authorization: bytes | None) -> ApiKey | str | None:
        """The key of an Authorization header verified before, or why it is refused (a 401's
        message), or None: it must be verified (`check`, a KDF) first."""
        if authorization is not None:
            seen = self._verified.get(hashlib.sha256(authorization).digest())
            if seen is not None:
                key = self._keys.get(seen[0])
                if key is not None and key.spec.secretHash == seen[1]:
                    expires = self._expires.get(seen[0])
                    if expires is None or time.time() < expires:
                        return key
        token = bearer_token(authorization)
        if token is None:
            return MISSING if authorization is None else MALFORMED
        name = key_name(token)
        key = self._keys.get(name) if name is not None else None
        if key is None:
            return INCORRECT
        expires = self._expires.get(key.name)
        if expires is not None and time.time() >= expires:
            return f"API key {key.name} expired at {key.spec.expires}"
        return None

    async def check(self, authorization: bytes | None) -> ApiKey | str:
        """The header's key, or why it is refused; verifies its secret (once) if need be."""
        known = self.check_now(authorization)
        if known is not None:
            return known
        token = bearer_token(authorization)
        assert token is not None   # check_now said it names a key
        name = key_name(token)
        assert name is not None
        key = self._keys[name]
        async with self._kdf:
            ok = await asyncio.to_thread(verify_secret, token, key.spec.secretHash)
        if not ok:
            return INCORRECT
        assert authorization is not None   # it carried a token
        if self._keys.get(name) is not key:   # deleted or changed while its hash was checked
            return INCORRECT
        digest = hashlib.sha256(authorization).digest()
        self._verified[digest] = (name, key.spec.secretHash)
        self._headers.setdefault(name, set()).add(digest)
        return key


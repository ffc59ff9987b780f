"""An ApiKey's secret: how it is made, what is stored of it, and how a presented one is checked.

A secret reads ``llmgw_<key name>_<48 hex digits>``: the name lets a gateway find the one ApiKey
to check it against (a salted hash cannot be looked up), the 192 random bits are the secret. Only
``scrypt$<n>$<r>$<p>$<salt>$<hash>`` (base64, standard library's hashlib.scrypt) is stored, in the
ApiKey's spec.secretHash: the secret is printed once, by `llmgw create apikey`, and never kept.
A reader who may not write ApiKeys (the built-in view role) gets ``REDACTED`` in its place from the
server; no secret matches it.
"""
from __future__ import annotations

import base64
import hashlib
import hmac
import secrets

PREFIX = "llmgw_"
_RANDOM_BYTES = 24
# scrypt's interactive cost (n=2**14, r=8: 16 MiB, tens of milliseconds): a gateway pays it once per
# key and gateway process (it caches what it verified), a guesser on every try.
_N, _R, _P = 1 << 14, 8, 1
_MAXMEM = 64 << 20
REDACTED = "redacted"   # the secretHash the server shows a reader who may not write ApiKeys


def new_secret(name: str) -> str:
    """A new secret for the ApiKey `name`."""
    return f"{PREFIX}{name}_{secrets.token_hex(_RANDOM_BYTES)}"


def key_name(secret: str) -> str | None:
    """The ApiKey a presented secret claims to be of, or None when it is not shaped as one."""
    if not secret.startswith(PREFIX):
        return None
    name, sep, rand = secret[len(PREFIX):].rpartition("_")
    return name if sep and name and len(rand) == 2 * _RANDOM_BYTES else None


def hash_secret(secret: str, *, n: int = _N, r: int = _R, p: int = _P) -> str:
    """What is stored of a secret: its scrypt hash with a fresh salt, and the parameters."""
    salt = secrets.token_bytes(16)
    digest = hashlib.scrypt(secret.encode(), salt=salt, n=n, r=r, p=p, maxmem=_MAXMEM, dklen=32)
    return f"scrypt${n}${r}${p}${_b64(salt)}${_b64(digest)}"


def verify_secret(secret: str, stored: str) -> bool:
    """Whether `secret` is the one `stored` (a hash_secret) was made of; a constant-time compare."""
    if stored == REDACTED:
        return False
    n, r, p, salt, digest = _parse(stored)
    got = hashlib.scrypt(secret.encode(), salt=salt, n=n, r=r, p=p, maxmem=_MAXMEM, dklen=len(digest))
    return hmac.compare_digest(got, digest)


def check_secret_hash(value: str) -> str:
    """A field validator: `value` is shaped as hash_secret makes them, or is REDACTED (as read by a
    user who may not write ApiKeys)."""
    if value != REDACTED:
        _parse(value)
    return value


def _parse(stored: str) -> tuple[int, int, int, bytes, bytes]:
    parts = stored.split("$")
    try:
        if len(parts) != 6 or parts[0] != "scrypt":
            raise ValueError
        n, r, p = (int(x) for x in parts[1:4])
        salt, digest = base64.b64decode(parts[4], validate=True), base64.b64decode(parts[5], validate=True)
    except ValueError:
        raise ValueError("not a secret hash: expected scrypt$N$R$P$SALT$HASH (base64), as `llmgw create "
                         "apikey` writes it; the secret itself is never stored") from None
    if n < 2 or n & (n - 1) or not 1 <= r <= 64 or not 1 <= p <= 16 or n * r * 128 > _MAXMEM // 2:
        raise ValueError(f"scrypt parameters out of bounds: n={n} (a power of 2), r={r}, p={p}")
    if len(salt) < 8 or len(digest) < 16:
        raise ValueError("the salt or the hash is too short")
    return n, r, p, salt, digest


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()

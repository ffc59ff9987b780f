"""Who sends a request: the one `Authenticator` protocol, which the key file (apikeys.py) and
the watched ApiKey objects (keyring.py) implement, and what both read of the Authorization header.
"""
from __future__ import annotations

from typing import Literal, Protocol

from llmgw.api import ApiKey

MISSING = "Missing API key: send it as 'Authorization: Bearer <key>'"
MALFORMED = "Malformed Authorization header: expected 'Bearer <key>'"
INCORRECT = "Incorrect API key provided"

# What authenticates a caller: its ApiKey object, or True for a key with no object (the file's).
Caller = ApiKey | Literal[True]


class Authenticator(Protocol):
    def check_now(self, authorization: bytes | None) -> Caller | str | None:
        """The caller of an Authorization header if known now, or why it is refused (a 401's
        message), or None: `check` must verify it first (it may wait, for a KDF)."""

    async def check(self, authorization: bytes | None) -> Caller | str:
        """The header's caller, or why it is refused."""


def bearer_token(authorization: bytes | None) -> str | None:
    """The key of an 'Authorization: Bearer <key>' header; None if there is none."""
    if not authorization:
        return None
    scheme, _, token = authorization.decode("latin-1").partition(" ")
    token = token.strip()
    return token if scheme.lower() == "bearer" and token else None

"""A request's routing key: its session, or a hash of its prompt's first bytes.

The prompt is rendered without re-serialising JSON: a completion's `prompt`
(or an embedding's `input`) as it is, a chat as `role\\ncontent\\n` for each
message in order, only as far as the first `limit` bytes (UTF-8). The hashes are
CRC-32 (zlib's: the cheapest hash at hand, and the same in every gateway process,
so gateways that share no state still agree on prefix-hash's ring; a collision
only puts two prefixes on one replica).

The session is the `X-Session-Id` header, else the body's `user` field: when a
request has one, prefix-hash places the session instead of the prefix, and
prefix-score's blocks start from it, so a session's requests stay together
even when its prompts' first bytes differ.
"""
from __future__ import annotations

import zlib
from collections.abc import Mapping
from typing import Any

BLOCK_BYTES = 256  # granularity of prefix-score's index: a prefix matches in blocks of this size
SESSION_HEADER = b"x-session-id"


def render(doc: Mapping[str, Any], limit: int) -> bytes:
    """The first `limit` bytes of the prompt as text."""
    messages = doc.get("messages")
    if isinstance(messages, list):
        pieces = []
        size = 0
        for m in messages:
            if not isinstance(m, dict):
                continue
            content = m.get("content")
            if isinstance(content, list):  # [{"type": "text", "text": ...}, ...]
                content = "".join(p.get("text", "") for p in content if isinstance(p, dict)
                                  and isinstance(p.get("text"), str))
            elif not isinstance(content, str):
                content = ""
            role = m.get("role")
            piece = f"{role if isinstance(role, str) else ''}\n{content[:limit - size]}\n"
            pieces.append(piece)
            size += len(piece)  # characters: at least as many bytes
            if size >= limit:
                break
        text = "".join(pieces)
    else:
        prompt = doc.get("prompt", doc.get("input"))
        if isinstance(prompt, list) and prompt:
            prompt = prompt[0] if isinstance(prompt[0], (str, list)) else prompt  # the first of several
        if isinstance(prompt, list):  # token ids
            text = ",".join(str(t) for t in prompt[:limit // 2 + 1])
        else:
            text = prompt if isinstance(prompt, str) else ""
    return text[:limit].encode("utf-8", "replace")[:limit]


def session(doc: Mapping[str, Any], header: bytes | None) -> bytes | None:
    if header:
        return header
    user = doc.get("user")
    return user.encode("utf-8", "replace") if isinstance(user, str) and user else None


def _session_hash(sess: bytes) -> int:
    return zlib.crc32(sess, zlib.crc32(b"session\0"))


def key_hash(doc: Mapping[str, Any], header: bytes | None, limit: int) -> int:
    """prefix-hash's key: the session's hash, else the prefix's, spread over 64 bits."""
    sess = session(doc, header)
    crc = _session_hash(sess) if sess is not None else zlib.crc32(render(doc, limit))
    return crc << 32 | crc


def key_blocks(doc: Mapping[str, Any], header: bytes | None, limit: int) -> list[int]:
    """prefix-score's key: block i's hash is the running CRC of the prefix up to block i's end
    (with the block's end in the high bits); with a session, a first block that is the session
    alone, so its requests match where it went before."""
    sess = session(doc, header)
    out = [] if sess is None else [_session_hash(sess)]
    data = render(doc, limit)
    crc = 0
    for end in range(BLOCK_BYTES, len(data) + BLOCK_BYTES, BLOCK_BYTES):
        crc = zlib.crc32(data[end - BLOCK_BYTES:end], crc)
        out.append(end << 32 | crc)
    return out or [0]

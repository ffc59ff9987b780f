"""vLLM's KV event wire format (vllm/distributed/kv_events.py; docs/contracts.md, "KV events").

A PUB socket sends each batch as three frames: the topic (UTF-8, "" by default),
the batch's sequence number (8 bytes, big-endian, from 0 in each engine process)
and the batch, msgpack-encoded as msgspec encodes vLLM's structs: a map
``{"ts": float, "events": [...], "data_parallel_rank": int}`` whose events are
maps tagged by ``"type"``, fields in declaration order, fields that have a
default left out when they hold it:

- BlockStored: block_hashes, parent_block_hash, token_ids, block_size, lora_id,
  medium, lora_name, extra_keys, group_idx, kv_cache_spec_kind
- BlockRemoved: block_hashes, medium, group_idx
- AllBlocksCleared: nothing else.

A ROUTER socket answers replay requests: a DEALER sends an empty frame and the
first wanted sequence number (8 bytes, big-endian); it gets back, each after an
empty frame, every buffered batch from there as (sequence number, batch), then
(-1 as 8 signed bytes, b""). Released vLLMs before the map layout (vllm#42892)
sent the batch and its events as arrays, and some send the topic ahead of a
replayed batch: the decoder reads both.
"""
from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import msgpack

MEDIUM = "GPU"
SPEC_KIND = "full_attention"
END_SEQ = (-1).to_bytes(8, "big", signed=True)
# The legacy array layout's positions (vLLM < #42892): BlockStored [tag, hashes, parent, tokens, size, ...],
# BlockRemoved [tag, hashes, ...].
_ARRAY_FIELDS = {"BlockStored": ("block_hashes", "parent_block_hash", "token_ids", "block_size"),
                 "BlockRemoved": ("block_hashes",), "AllBlocksCleared": ()}


def seq_bytes(seq: int) -> bytes:
    return seq.to_bytes(8, "big")


def stored(keys: Sequence[int], parent: int | None, token_ids: Sequence[int], block_size: int,
           lora: tuple[str, int] | None = None, salt: str | None = None) -> dict[str, Any]:
    """`lora`: the adapter the blocks were computed under (its name, its load's id), whose name is
    each block's extra key; `salt`: the request's cache_salt, the first block's (where `parent` is
    None: the blocks begin the chain) last extra key."""
    name, lora_id = lora if lora is not None else (None, None)
    extra: list[list[str] | None] = [None if name is None else [name]] * len(keys)
    if salt is not None and parent is None and extra:
        extra[0] = [*(extra[0] or []), salt]
    return {"type": "BlockStored", "block_hashes": list(keys), "parent_block_hash": parent,
            "token_ids": list(token_ids), "block_size": block_size, "lora_id": lora_id, "medium": MEDIUM,
            "lora_name": name, "extra_keys": extra, "group_idx": 0, "kv_cache_spec_kind": SPEC_KIND}


def removed(keys: Sequence[int]) -> dict[str, Any]:
    return {"type": "BlockRemoved", "block_hashes": list(keys), "medium": MEDIUM, "group_idx": 0}


def cleared() -> dict[str, Any]:
    return {"type": "AllBlocksCleared"}


def encode_batch(events: list[dict[str, Any]], rank: int = 0) -> bytes:
    payload: bytes = msgpack.packb({"ts": time.time(), "events": events, "data_parallel_rank": rank})
    return payload


@dataclass(frozen=True)
class Event:
    """One decoded event; `keys` are block hashes (ints, or bytes from an engine that sends bytes)."""

    kind: str  # BlockStored | BlockRemoved | AllBlocksCleared (others are skipped)
    keys: tuple[Any, ...] = ()
    parent: Any = None
    token_ids: tuple[int, ...] = ()
    block_size: int = 0
    extra_keys: tuple[Any, ...] | None = None  # each block's extra keys (a LoRA adapter's name, ...)
    lora_name: str | None = None  # the LoRA adapter the stored blocks were computed under
    cache_salt: str | None = None  # the salt of the request that stored them (SGLang says it)


@dataclass(frozen=True)
class Batch:
    ts: float  # when the engine published it (its clock)
    events: list[Event]


def decode_batch(payload: bytes) -> Batch:
    """A batch; ValueError when it is not a KV event batch."""
    try:
        batch = msgpack.unpackb(payload, strict_map_key=False)
    except (ValueError, msgpack.UnpackException) as e:
        raise ValueError(f"not msgpack: {e}") from None
    if isinstance(batch, dict):
        ts, raw = batch.get("ts"), batch.get("events")
    elif isinstance(batch, list) and len(batch) > 1:
        ts, raw = batch[0], batch[1]
    else:
        ts, raw = None, None
    if not isinstance(raw, list) or not isinstance(ts, (int, float)):
        raise ValueError("not a KV event batch: no ts and events")
    out = []
    for item in raw:
        ev = item
        if isinstance(item, list) and item and item[0] in _ARRAY_FIELDS:
            ev = {"type": item[0], **dict(zip(_ARRAY_FIELDS[item[0]], item[1:], strict=False))}
        if not isinstance(ev, dict) or ev.get("type") not in _ARRAY_FIELDS:
            continue  # an event kind this router does not use
        out.append(Event(ev["type"], tuple(ev.get("block_hashes") or ()), ev.get("parent_block_hash"),
                         tuple(ev.get("token_ids") or ()), int(ev.get("block_size") or 0),
                         tuple(ev["extra_keys"]) if isinstance(ev.get("extra_keys"), list) else None,
                         ev.get("lora_name") if isinstance(ev.get("lora_name"), str) else None,
                         ev.get("cache_salt") if isinstance(ev.get("cache_salt"), str) else None))
    return Batch(float(ts), out)

"""The sim playing SGLang (`llmgw sim --api sglang`): SGLang 0.5.23's runtime LoRA API and KV events.

LoRA, as python/sglang/srt/entrypoints/http_server.py, managers/tokenizer_control_mixin.py
and lora/lora_manager.py have it: POST /load_lora_adapter {"lora_name", "lora_path",
"pinned"} and /unload_lora_adapter {"lora_name"}, served with or without --enable-lora
(without, every call fails so). Each answers a LoRAUpdateOutput as JSON, 200 where it
succeeded and 400 where not: {"rid", "http_worker_ipc", "success", "error_message",
"loaded_adapters": {name: path}}. A name loaded already, a path with no
adapter_config.json, or an unknown name to unload fails; a missing field is FastAPI's 422.
A load past --max-loras (SGLang's --max-loaded-loras) unloads the least recently used
unpinned adapter instead of failing. A request names an adapter as `BASE:ADAPTER` in
its model (serving_base._parse_model_parameter); one not loaded is a 400.

KV events, as mem_cache/events.py and disaggregation/kv_events.py publish them by
default: a batch is the array [ts, events, attn_dp_rank]; BlockStored carries
block_hashes, parent_block_hash, token_ids, block_size, lora_id (null), medium and,
for a salted request's blocks, cache_salt, for an adapter's, lora_name; BlockRemoved block_hashes and medium. Block
hashes are SGLang's page hashes (llmgw.routing.kvblocks.SGLangBlockHasher); an
adapter's blocks are keyed with its name and its load's id, which the gateway cannot
know, as SGLang namespaces them with the id.
"""
from __future__ import annotations

import json
import os
import time
from collections.abc import Sequence
from typing import Any

import msgpack
from aiohttp import web

from llmgw.kvevents.wire import MEDIUM

LOAD = "/load_lora_adapter"
UNLOAD = "/unload_lora_adapter"
NOT_ENABLED = "LoRA is not enabled. Please set `--enable-lora` to enable LoRA."


# ------------------------------------------------------------------ KV events

def stored(keys: Sequence[int], parent: int | None, token_ids: Sequence[int], block_size: int,
           lora: tuple[str, int] | None = None, salt: str | None = None) -> dict[str, Any]:
    event: dict[str, Any] = {"type": "BlockStored", "block_hashes": list(keys), "parent_block_hash": parent,
                             "token_ids": list(token_ids), "block_size": block_size, "lora_id": None,
                             "medium": MEDIUM}
    if salt is not None:
        event["cache_salt"] = salt
    if lora is not None:
        event["lora_name"] = lora[0]
    return event


def removed(keys: Sequence[int]) -> dict[str, Any]:
    return {"type": "BlockRemoved", "block_hashes": list(keys), "medium": MEDIUM}


def encode_batch(events: list[dict[str, Any]], rank: int = 0) -> bytes:
    payload: bytes = msgpack.packb([time.time(), events, rank])
    return payload


# ------------------------------------------------------------------ LoRA

def adapter_of(model: object, served: str) -> str | None:
    """The adapter a request's model names (`BASE:ADAPTER`), as SGLang parses it; None for none."""
    if not isinstance(model, str) or ":" not in model or model == served:
        return None
    _, adapter = (served, model[len(served) + 1:]) if model.startswith(f"{served}:") else model.split(":", 1)
    return adapter.strip() or None


def answer(success: bool, loaded: dict[str, str], message: str | None = None) -> web.Response:
    """A LoRAUpdateOutput, as SGLang's handler returns it."""
    body = {"rid": None, "http_worker_ipc": None, "success": success,
            "error_message": "" if success else message, "loaded_adapters": dict(loaded)}
    return web.Response(status=200 if success else 400, body=json.dumps(body).encode(),
                        content_type="application/json")


def missing(body: dict[str, Any], *fields: str) -> web.Response | None:
    """FastAPI's 422 for required fields the body lacks (or gives as other than strings)."""
    detail = [{"type": "missing", "loc": ["body", f], "msg": "Field required", "input": body}
              for f in fields if not isinstance(body.get(f), str)]
    if not detail:
        return None
    return web.Response(status=422, body=json.dumps({"detail": detail}).encode(), content_type="application/json")


def load_failure(name: str, path: str, loaded: dict[str, str]) -> str | None:
    """Why lora_manager would not load `path` as `name` (None: it would)."""
    if name in loaded:
        return f"Failed to load LoRA adapter {name} because it is already loaded"
    config = os.path.join(path, "adapter_config.json")
    if not os.path.isfile(config):
        return f"[Errno 2] No such file or directory: '{config}'"
    return None


def unload_failure(name: str, loaded: dict[str, str]) -> str | None:
    if name not in loaded:
        return f"LoRA with name {name} does not exist. Loaded LoRAs: dict_keys({list(loaded)!r})"
    return None


def not_loaded(adapter: str, loaded: dict[str, str]) -> str:
    return (f"The following requested LoRA adapters are not loaded: {adapter}\n"
            f"Loaded adapters: dict_keys({list(loaded)!r}).")

"""The sim engine's prefix cache: block-hashed as vLLM's, LRU-evicted at a capacity in tokens.

A prompt's token ids are cut into blocks of `block_size`; block i's key is
vLLM's chained hash of block i-1's and block i's tokens (llmgw.routing.kvblocks,
seeded with PYTHONHASHSEED as vLLM is, else with vLLM's default seed), so a key
names the whole prefix up to the end of its block (a partial last block is
never cached, as in vLLM). A prompt hits on the longest run of its leading
blocks that are cached. A request under a LoRA adapter hashes its blocks with
the adapter's name as vLLM's extra key (its events name the adapter and that
load's id, as vLLM's): it never hits the base's blocks or another adapter's. A
request's cache_salt keys its blocks as the engine does (kvblocks: vLLM 0.34's
extra key of the first block, whose event's extra keys then say the salt): it hits
only blocks of its salt. A
prompt's blocks are touched tail first, so the tail of a chain is evicted before
its head, as vLLM's free queue does.

Every change is told to `on_events` as vLLM's KV events (llmgw.kvevents.wire),
evictions before the stores that needed their room, one batch per admitted prompt.
Playing SGLang (`api="sglang"`), blocks are SGLang's pages, keyed and told as
SGLang's (llmgw.sim.sglang); an adapter's with its name and its load's id.
"""
from __future__ import annotations

import os
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import Any

from llmgw.kvevents import wire
from llmgw.routing.kvblocks import BlockHasher, SGLangBlockHasher
from llmgw.sim import sglang

DEFAULT_SEED = "vllm-none-hash"  # vLLM's NONE_HASH seed for sha256_cbor without PYTHONHASHSEED


class PrefixCache:
    """Cached blocks, least recently used first; capacity 0 caches nothing."""

    def __init__(self, block_size: int, capacity_tokens: int,
                 on_events: Callable[[list[dict[str, Any]]], None] | None = None, api: str = "vllm"):
        self.block_size = block_size
        self.capacity_blocks = capacity_tokens // block_size
        hasher = SGLangBlockHasher if api == "sglang" else BlockHasher
        self.hasher = hasher(block_size, os.environ.get("PYTHONHASHSEED", DEFAULT_SEED))
        self.events = sglang if api == "sglang" else wire  # how its events are told: stored(), removed()
        self.lora_keys = 2 if api == "sglang" else 1  # a LoRA block's extra keys: (name, load id)[:lora_keys]
        self.on_events = on_events
        self._blocks: OrderedDict[int, None] = OrderedDict()
        self.queries = 0  # prompt tokens looked up, as vLLM counts them
        self.hits = 0  # of which were cached

    @property
    def cached_tokens(self) -> int:
        return len(self._blocks) * self.block_size

    def admit(self, ids: Sequence[int], lora: tuple[str, int] | None = None, salt: str | None = None) -> int:
        """Look a prompt's token ids up, then cache its blocks; how many of its leading tokens were cached.
        `lora`: the adapter it runs under (its name and load id); its name is an extra key of every block.
        `salt`: its cache_salt."""
        keys = self.hasher.keys(ids, lora[:self.lora_keys] if lora is not None else None, salt=salt)
        blocks = self._blocks
        hit = 0
        for key in keys:
            if key not in blocks:
                break
            hit += 1
        for key in keys[:hit]:  # kept from the evictions this prompt makes room with
            blocks.move_to_end(key)
        events: list[dict[str, Any]] = []
        run: list[int] = []  # indices of the blocks stored since the last event
        size = self.block_size

        def flush() -> None:
            if run:
                parent = keys[run[0] - 1] if run[0] else None
                events.append(self.events.stored([keys[i] for i in run], parent,
                                          ids[run[0] * size:(run[-1] + 1) * size], size, lora, salt))
                run.clear()

        if self.capacity_blocks:
            for i in range(hit, len(keys)):
                if len(blocks) >= self.capacity_blocks:
                    flush()
                    events.append(self.events.removed([blocks.popitem(last=False)[0]]))
                blocks[keys[i]] = None
                run.append(i)
            flush()
            for key in reversed(keys):  # the prompt's blocks become the most recently used, tail first
                if key in blocks:
                    blocks.move_to_end(key)
        if events and self.on_events is not None:
            self.on_events(events)
        cached = hit * self.block_size
        self.queries += len(ids)
        self.hits += cached
        return cached

    def reset(self) -> None:
        self._blocks.clear()
        if self.on_events is not None:
            self.on_events([wire.cleared()])

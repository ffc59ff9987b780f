"""The sim engine's prefix cache: block-hashed like vLLM's, LRU-evicted at a capacity in tokens.

A prompt's tokens are cut into blocks of `block_size`; block i's key is a hash
of block i-1's key and block i's tokens, so a key names the whole prefix up to
the end of its block (a partial last block is never cached, as in vLLM). A
prompt hits on the longest run of its leading blocks that are cached. A request
under a LoRA adapter chains from that load's id (`salt`), as vLLM's block hashes
include the LoRA: it never hits the base's blocks, nor those of another adapter or
of the same adapter's earlier load (other weights).
"""
from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence


def block_keys(tokens: Sequence[str | int], block_size: int, salt: int = 0) -> list[int]:
    """The chained keys of a prompt's whole blocks (`salt`: a LoRA load's id, 0 for the base)."""
    keys = []
    key = salt
    for start in range(0, len(tokens) - block_size + 1, block_size):
        key = hash((key, tuple(tokens[start:start + block_size])))
        keys.append(key)
    return keys


class PrefixCache:
    """Cached blocks, least recently used first; capacity 0 caches nothing."""

    def __init__(self, block_size: int, capacity_tokens: int):
        self.block_size = block_size
        self.capacity_blocks = capacity_tokens // block_size
        self._blocks: OrderedDict[int, None] = OrderedDict()
        self.queries = 0  # prompt tokens looked up, as vLLM counts them
        self.hits = 0  # of which were cached

    @property
    def cached_tokens(self) -> int:
        return len(self._blocks) * self.block_size

    def admit(self, tokens: Sequence[str | int], salt: int = 0) -> int:
        """Look a prompt up, then cache its blocks; the number of its leading tokens that were cached."""
        keys = block_keys(tokens, self.block_size, salt)
        blocks = self._blocks
        hit = 0
        for key in keys:
            if key not in blocks:
                break
            hit += 1
        for key in keys:  # the prompt's blocks become the most recently used
            if key in blocks:
                blocks.move_to_end(key)
            elif self.capacity_blocks:
                blocks[key] = None
        while len(blocks) > self.capacity_blocks:
            blocks.popitem(last=False)
        cached = hit * self.block_size
        self.queries += len(tokens)
        self.hits += cached
        return cached

    def reset(self) -> None:
        self._blocks.clear()

"""The sim engine's prefix cache: block-hashed like vLLM's, LRU-evicted at a capacity in tokens.

A prompt's tokens are cut into blocks of `block_size`; block i's key is a hash
of block i-1's key and block i's tokens, so a key names the whole prefix up to
the end of its block (a partial last block is never cached, as in vLLM). A
prompt hits on the longest run of its leading blocks that are cached.
"""
from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

from llmgw.sim.tokens import Token


def block_keys(tokens: Sequence[Token], block_size: int) -> list[int]:
    """The chained keys of a prompt's whole blocks."""
    keys = []
    key = 0
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

    def admit(self, tokens: Sequence[Token]) -> int:
        """Look a prompt up, then cache its blocks; the number of its leading tokens that were cached."""
        keys = block_keys(tokens, self.block_size)
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

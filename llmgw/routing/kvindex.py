"""precise-prefix's index of one model: which replicas hold which blocks, from their engines' KV events.

Fed by the gateway's subscriber (llmgw.kvevents.subscriber) with the decoded
events of each replica's engine: a block hash maps to the replicas that hold
it, and each replica to the hashes it holds (so a replica that restarts,
clears its cache or leaves is dropped in one step). It is exact for what it
was told: its size is the engines' caches, not a bound of its own.

The block size is the engines': the first BlockStored sets it. Keys the
gateway computes can still never match, silently, where the engine's seed or
hash algorithm differs from the gateway's (kvblocks.HASH_SEED, sha256_cbor), or
replicas disagree on the block size; the index checks a replica's stored chains
that start at the root against its own hashes of the event's tokens until one
agrees (again once it restarts or clears its cache), and on a disagreement
`refused` says why and routing falls back to prefix-score.
A LoRA adapter's blocks are held under the gateway's own keys of them (their
tokens chained with the adapter's name, as kvblocks keys a request for it),
whatever the engine hashed them with: vLLM 0.34 adds the adapter's path on the
node, which the gateway does not know, SGLang the id of the adapter's load. The
engines' keys are vLLM's unless the gateway says otherwise for a replica
(`hashes`: its engine's Engine.block_hashes, SGLang's page hashes); replicas of one
model that key blocks differently are refused. Each replica's map from its engine's
hashes of such blocks to the gateway's follows their removal.
That check cannot see a gateway that tokenizes otherwise than the engines: its
keys are well made but of other tokens. `lookups` and `matched` count the
lookups and those that found a leading block anywhere; `unmatched` says so once
NEVER_MATCHED lookups found none while the index held blocks.
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from llmgw.routing.kvblocks import HASH_SEED, HASHERS, VLLM_HASHES, BlockHasher, request_token_ids

if TYPE_CHECKING:
    from tokenizers import Tokenizer

    from llmgw.routing.chattemplate import ChatTemplate

_NONE: frozenset[str] = frozenset()
NEVER_MATCHED = 200  # lookups that matched nothing (the index holding blocks) before `unmatched` says so


class KVEvent(Protocol):
    """A decoded KV event (llmgw.kvevents.wire.Event)."""

    @property
    def kind(self) -> str: ...
    @property
    def keys(self) -> tuple[Any, ...]: ...
    @property
    def parent(self) -> Any: ...
    @property
    def token_ids(self) -> tuple[int, ...]: ...
    @property
    def block_size(self) -> int: ...
    @property
    def extra_keys(self) -> tuple[Any, ...] | None: ...
    @property
    def lora_name(self) -> str | None: ...
    @property
    def cache_salt(self) -> str | None: ...


class KVIndex:
    def __init__(self, seed: str = HASH_SEED):
        self.seed = seed
        self.hasher: BlockHasher | None = None  # once the engines' block size is known
        self.tokenizer: Tokenizer | None = None  # the model's, where the gateway has its tokenizer.json
        self.template: ChatTemplate | None = None  # its chat template, where it has one
        self.refused: str | None = None  # why the gateway's keys cannot match the engines'
        self.verified = 0  # stored chains whose hashes the gateway computed the same
        self._agreed: set[str] = set()  # replicas one of whose chains it computed the same (not checked again)
        self.lookups = 0  # keys() calls with a whole block to look up
        self.matched = 0  # of which some replica held the first block
        self.stored: dict[str, int] = {}  # replica -> blocks it has stored so far (precise_prefix.py's clock)
        self._where: dict[Any, set[str]] = {}  # block hash -> replicas holding it
        self._held: dict[str, set[Any]] = {}  # replica -> block hashes it holds
        self._lora: dict[str, dict[Any, bytes]] = {}  # replica -> its engine's hash of a LoRA block -> ours
        self.hashes: dict[str, str] = {}  # replica -> how its engine keys blocks (kvblocks.HASHERS; else vLLM's)

    def __len__(self) -> int:
        return len(self._where)

    @property
    def usable(self) -> bool:
        return self.hasher is not None and self.refused is None and bool(self._where)

    def blocks_of(self, replica: str) -> int:
        return len(self._held.get(replica, ()))

    def token_ids(self, doc: Mapping[str, Any]) -> list[int]:
        """The request's prompt token ids; none where its chat template refuses it (so does the engine)."""
        try:
            return request_token_ids(doc, self.tokenizer, self.template)
        except ValueError:
            return []

    def keys(self, token_ids: Sequence[int], lora: str | None = None, salt: str | None = None) -> list[int]:
        """The keys of the prompt's leading blocks that some replica holds (kvblocks.BlockHasher.keys:
        hashed no further than that), of a request for the LoRA adapter `lora` if given (vLLM's extra
        key of every block: the adapter's name), with the request's cache_salt `salt` if any. None for
        an adapter's request with a salt: the index keys an adapter's salted blocks as the engine did."""
        hasher = self.hasher
        if hasher is None or len(token_ids) < hasher.block_size or (lora is not None and salt is not None):
            return []
        keys = hasher.keys(token_ids, (lora,) if lora is not None else None, held=self._where, salt=salt)
        self.lookups += 1
        self.matched += bool(keys)
        return keys

    # ------------------------------------------------------------ events

    def apply(self, replica: str, events: Iterable[KVEvent]) -> None:
        for e in events:
            if e.kind == "BlockStored":
                self._check(replica, e)
                self.stored[replica] = self.stored.get(replica, 0) + len(e.keys)
                held = self._held.setdefault(replica, set())
                for key in self._ours(replica, e):
                    self._where.setdefault(key, set()).add(replica)
                    held.add(key)
            elif e.kind == "BlockRemoved":
                held = self._held.get(replica, set())
                lora = self._lora.get(replica, {})
                ext = self.hasher.external if self.hasher is not None else None
                for key in (ext(lora.pop(k)) if ext is not None and k in lora else k for k in e.keys):
                    held.discard(key)
                    where = self._where.get(key)
                    if where is not None:
                        where.discard(replica)
                        if not where:
                            del self._where[key]
            elif e.kind == "AllBlocksCleared":
                self.drop(replica)

    def drop(self, replica: str) -> None:
        """Forget what `replica` holds: it restarted, cleared its cache, lost events or left. Once no
        replica holds anything, the block size and a refusal are forgotten too: the next engines (a
        rollout that fixed their seed) are checked afresh."""
        self._lora.pop(replica, None)
        self.stored.pop(replica, None)
        self._agreed.discard(replica)
        for key in self._held.pop(replica, ()):
            where = self._where.get(key)
            if where is not None:
                where.discard(replica)
                if not where:
                    del self._where[key]
        if not self._held:
            self.hasher, self.refused = None, None

    def _ours(self, replica: str, e: KVEvent) -> tuple[Any, ...]:
        """The keys the gateway gives a stored event's blocks: the engine's, but for a LoRA adapter's,
        keyed from their tokens and their parent as a request for the adapter is (the engine's keys
        where the parent, or the tokens, are not known, or the blocks are salted)."""
        hasher = self.hasher
        if e.lora_name is None or hasher is None or len(e.token_ids) != len(e.keys) * hasher.block_size \
                or e.cache_salt is not None or any(k is not None and list(k) != [e.lora_name]
                                                   for k in e.extra_keys or ()):
            return e.keys
        lora = self._lora.setdefault(replica, {})
        parent = hasher.root if e.parent is None else lora.get(e.parent)
        if parent is None:
            return e.keys
        digests = hasher.chain(parent, e.token_ids, (e.lora_name,))
        lora.update(zip(e.keys, digests, strict=True))
        return tuple(hasher.external(d) for d in digests)

    def _check(self, replica: str, e: KVEvent) -> None:
        if self.refused is not None:
            return
        hashes = self.hashes.get(replica, VLLM_HASHES)
        if self.hasher is None:
            self.hasher = HASHERS[hashes](e.block_size, self.seed)
        elif HASHERS[hashes] is not type(self.hasher):
            self.refused = (f"replica {replica} keys blocks with {HASHERS[hashes].name}, another of this "
                            f"model with {self.hasher.name}")
            return
        elif e.block_size != self.hasher.block_size:
            self.refused = (f"replica {replica} caches blocks of {e.block_size} tokens, another of this "
                            f"model {self.hasher.block_size}")
            return
        if (e.parent is None and e.token_ids and not any(e.extra_keys or ()) and e.lora_name is None
                and replica not in self._agreed):
            # a chain from the root without extra keys: the gateway can hash it too. An event's extra
            # keys are not always those hashed (vLLM 0.34 hashes a LoRA block with ("lora", name, path),
            # publishes (name,); SGLang publishes none and namespaces a LoRA block's hash with its load's id).
            # Once one agreed, not each after it: a cold 8k-token prompt's chain is 512 hashes, 3 ms of
            # the gateway's loop.
            if self.hasher.agrees(e.token_ids, e.keys, e.cache_salt):
                self.verified += 1
                self._agreed.add(replica)
            else:
                seeded = f" seeded with PYTHONHASHSEED={self.seed}" if self.hasher.root else ""
                self.refused = (f"replica {replica}'s block hashes are not {self.hasher.name}{seeded}: "
                                f"the gateway's keys would never match")

    # ------------------------------------------------------------ lookups

    @property
    def unmatched(self) -> str | None:
        """Why the gateway's keys look like other tokens than the engines': no lookup ever matched."""
        if self.matched or self.lookups < NEVER_MATCHED:
            return None
        return (f"none of {self.lookups} requests' first blocks was held by any replica: the gateway may "
                f"not tokenize as the engines do")

    def matches(self, keys: Sequence[Any], replicas: Sequence[str]) -> dict[str, int]:
        """For each replica, how many of the leading blocks it holds."""
        counts = dict.fromkeys(replicas, 0)
        alive = set(replicas)
        where = self._where
        for n, key in enumerate(keys):
            holders = where.get(key, _NONE)
            if alive <= holders:  # the run goes on everywhere it did (the most blocks: no new set)
                continue
            for r in alive - holders:
                counts[r] = n
            alive &= holders
            if not alive:
                return counts
        for r in alive:
            counts[r] = len(keys)
        return counts

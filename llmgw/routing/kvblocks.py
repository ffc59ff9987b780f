"""vLLM's prefix-cache block keys, computed outside the engine (docs/contracts.md, "KV events").

vLLM names a cached block by a chain of hashes: block i's hash is
``sha256_cbor((parent, tuple(block_i_token_ids), extra_keys))`` where parent is
block i-1's hash (32 bytes) and, for block 0, NONE_HASH = ``sha256_cbor(seed)``;
``sha256_cbor`` is SHA-256 of the canonical CBOR encoding (a tuple is a CBOR array,
None is null). The seed is the engine's PYTHONHASHSEED, which the renderers set to
HASH_SEED when events are on (vLLM otherwise picks a default that differs across
versions, or a random one); extra_keys is None without a LoRA adapter, multimodal
input or cache salt. Only whole blocks are hashed. KV events carry each hash as an
integer, its 32 bytes read big-endian and cut to the low 64 bits (vLLM's default,
VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=1). A request's cache_salt is an extra key of its
first block, ("cache_salt", salt) as vLLM 0.34 tags it.

SGLang (SGLangBlockHasher, HASHERS["sha256_uint32"]) keys pages of --page-size tokens its own
way: SHA-256 of the parent page's digest and the page's token ids as little-endian
uint32, no seed, a salted chain starting from a digest of the salt; its events carry
a digest's first 8 bytes as a signed integer.

Where the model has a tokenizer.json (the Hugging Face layout, read with
`tokenizers`), a completion's token ids are its prompt texts' encodings one after
the other, and a chat's those of its chat template's rendering
(llmgw.routing.chattemplate), special tokens not added again (vLLM's
`add_special_tokens`, false for a chat); without a template, each message's text
content's encoding in order. Without one, a token is a word of the prompt, as the sim
reads one (llmgw sim): its id is the word's CRC-32 cut to 31 bits. A prompt
given as token ids keeps them.
"""
from __future__ import annotations

import functools
import hashlib
import struct
import zlib
from collections.abc import Container, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import cbor2

if TYPE_CHECKING:
    from tokenizers import Tokenizer

    from llmgw.routing.chattemplate import ChatTemplate

HASH_SEED = "0"  # PYTHONHASHSEED of an engine that publishes KV events: the gateway's seed
HASH_ALGO = "sha256_cbor"  # vLLM's --prefix-caching-hash-algo that this module computes
BLOCKS_MEMO = 65536  # blocks whose hashes are remembered (about 20 MB): 150 contexts of 6k tokens' worth
CHUNK = 16  # blocks hashed and remembered together
TEXTS_MEMO = 1024  # texts whose word ids are remembered
_LOW64 = (1 << 64) - 1
_WORD_BITS = 0x7FFFFFFF  # a word's token id: its CRC-32 cut to 31 bits

def sha256_cbor(value: Any) -> bytes:
    return hashlib.sha256(cbor2.dumps(value, canonical=True)).digest()


def external(digest: bytes) -> int:
    """A block hash as KV events carry it."""
    return int.from_bytes(digest, "big") & _LOW64


@functools.lru_cache(maxsize=BLOCKS_MEMO // CHUNK)
def _chunk(parent: bytes, tokens: tuple[int, ...], size: int, extra: tuple[Any, ...] | None
           ) -> tuple[tuple[bytes, int], ...]:
    """The (hash, event key) of each block of `tokens` (whole blocks of `size`), chained from `parent`."""
    out = []
    for start in range(0, len(tokens), size):
        parent = sha256_cbor((parent, tokens[start:start + size], extra))
        out.append((parent, external(parent)))
    return tuple(out)


class BlockHasher:
    """One engine's block keys: its block size and seed (vLLM's, the sim's)."""

    chunk = staticmethod(_chunk)  # the (hash, event key) of a run of blocks chained from a parent
    external = staticmethod(external)  # a block hash as events carry it
    name = "vLLM's sha256_cbor"  # what the keys are, for a refusal
    blocks_per_chunk = CHUNK

    def __init__(self, block_size: int, seed: str = HASH_SEED):
        self.block_size = block_size
        self.root = sha256_cbor(seed)

    def chain(self, parent: bytes, token_ids: Sequence[int], extra: tuple[Any, ...] | None = None) -> list[bytes]:
        """The hashes of the whole blocks of `token_ids`, chained from `parent` (a stored event's blocks,
        re-keyed as a request would key them)."""
        whole = len(token_ids) - len(token_ids) % self.block_size
        return [d for d, _ in self.chunk(parent, tuple(token_ids[:whole]), self.block_size, extra)] if whole else []

    def salted(self, token_ids: Sequence[int], extra: tuple[Any, ...] | None, salt: str) -> tuple[bytes, int]:
        """Where a request's chain with a cache_salt starts: (the parent of the first block hashed as
        others, that block's offset). vLLM 0.34 (generate_block_hash_extra_keys) adds
        ("cache_salt", salt) to the first block's extra keys: that block is hashed here."""
        first = tuple(token_ids[:self.block_size])
        return sha256_cbor((self.root, first, (*(extra or ()), ("cache_salt", salt)))), self.block_size

    def keys(self, token_ids: Sequence[int], extra: tuple[Any, ...] | None = None,
             held: Container[int] | None = None, salt: str | None = None) -> list[int]:
        """The event keys (external hashes) of the prompt's whole blocks, chained from the root
        (NONE_HASH); `extra`: vLLM's extra keys of every block (a LoRA adapter's, say); `salt`: the
        request's cache_salt (salted). With `held`,
        only the leading ones it holds: nothing past the first it does not hold can be a hit, and a
        new question after a long known context is not hashed past its first chunk. Blocks are
        hashed and remembered CHUNK at a time: prompts repeat their long prefixes (system prompts, a
        conversation's history), and a known one then costs a lookup per chunk, not per block."""
        out: list[int] = []
        parent = self.root
        size = self.block_size
        whole = len(token_ids) - len(token_ids) % size
        first = 0
        if salt is not None and whole:
            parent, first = self.salted(token_ids, extra, salt)
            if first:
                out.append(self.external(parent))
                if held is not None and out[0] not in held:
                    return []
        span = size * self.blocks_per_chunk
        for start in range(first, whole, span):
            blocks = self.chunk(parent, tuple(token_ids[start:min(start + span, whole)]), size, extra)
            for _, key in blocks:
                if held is not None and key not in held:
                    return out
                out.append(key)
            parent = blocks[-1][0]
        return out

    def agrees(self, token_ids: Sequence[int], keys: Sequence[int], salt: str | None = None) -> bool:
        """Whether a chain the engine stored from its root has the keys this hasher computes."""
        return self.keys(token_ids, salt=salt) == list(keys)


# ---------------------------------------------------------------- SGLang's page keys

_U32 = (1 << 32) - 1
SGLANG_SALT = b"sglang-cache-salt-v1\0"  # utils.compute_node_event_hash_values' seed of a salted chain


def _sglang_page_tokens(tokens: Sequence[int]) -> bytes:
    """A page's token ids as SGLang hashes them (cpp_utils/hash_binding.cpp): little-endian uint32,
    or, where one does not fit, a 0xff byte and uint64s."""
    if any(t > _U32 for t in tokens):
        return b"\xff" + struct.pack(f"<{len(tokens)}Q", *tokens)
    return struct.pack(f"<{len(tokens)}I", *tokens)


def sglang_external(digest: bytes) -> int:
    """A page hash as SGLang's events carry it (utils.hash_str_to_int64): its first 8 bytes, big-endian,
    a signed 64-bit integer."""
    return int.from_bytes(digest[:8], "big", signed=True)


SGLANG_CHUNK = CHUNK * 16  # pages hashed and remembered together: SGLang's default page is one token


@functools.lru_cache(maxsize=2 * BLOCKS_MEMO // SGLANG_CHUNK)  # 131072 pages: about 26 MB
def _sglang_chunk(parent: bytes, tokens: tuple[int, ...], size: int, extra: tuple[Any, ...] | None
                  ) -> tuple[tuple[bytes, int], ...]:
    """As _chunk, of SGLang's pages: each SHA-256 of the parent page's digest (nothing before the
    first page of an unsalted chain), the page's tokens (_sglang_page_tokens) and, for the gateway's
    own keys of a LoRA adapter's pages (SGLang namespaces them with its load's id), `extra`'s CBOR.
    The run's tokens are packed at once where none passes 32 bits."""
    if any(t > _U32 for t in tokens):
        pages = [_sglang_page_tokens(tokens[start:start + size]) for start in range(0, len(tokens), size)]
    else:
        packed, step = struct.pack(f"<{len(tokens)}I", *tokens), 4 * size
        pages = [packed[start:start + step] for start in range(0, len(packed), step)]
    tail = cbor2.dumps(extra, canonical=True) if extra else b""
    out = []
    for page in pages:
        parent = hashlib.sha256(parent + page + tail).digest()
        out.append((parent, sglang_external(parent)))
    return tuple(out)


class SGLangBlockHasher(BlockHasher):
    """SGLang's page keys (0.5.23, its radix cache's KV events in the default format): pages of
    --page-size tokens chained by their SHA-256 digests (_sglang_chunk), the first with no parent, or
    with SHA-256(SGLANG_SALT + salt) under a cache_salt; no seed."""

    chunk = staticmethod(_sglang_chunk)
    external = staticmethod(sglang_external)
    name = "SGLang's page hashes"
    blocks_per_chunk = SGLANG_CHUNK

    def __init__(self, block_size: int, seed: str = HASH_SEED):
        super().__init__(block_size, seed)
        self.root = b""

    def salted(self, token_ids: Sequence[int], extra: tuple[Any, ...] | None, salt: str) -> tuple[bytes, int]:
        return hashlib.sha256(SGLANG_SALT + salt.encode("utf-8")).digest(), 0


# By Engine.block_hashes: the scheme's name, not the engine's (what llmgw knows of an engine stays in its
# module). vLLM's sha256_cbor is the default (VLLM_HASHES); SGLang hashes each page's tokens as uint32s.
VLLM_HASHES = "sha256_cbor"
HASHERS: dict[str, type[BlockHasher]] = {VLLM_HASHES: BlockHasher, "sha256_uint32": SGLangBlockHasher}


# ---------------------------------------------------------------- tokens without a tokenizer

def word_id(word: str) -> int:
    """A word's token id: its CRC-32, 31 bits."""
    return zlib.crc32(word.encode("utf-8", "replace")) & _WORD_BITS


# str.split()'s ASCII whitespace that bytes.split() does not split on (the information separators)
_SEPARATORS = bytes.maketrans(b"\x1c\x1d\x1e\x1f", b"    ")


@functools.lru_cache(maxsize=TEXTS_MEMO)
def _words(text: str) -> tuple[int, ...]:
    """word_id of each of the text's words (str.split()'s); an ASCII text split as bytes, in a third of
    the time of a word at a time (a new question's words were half of an 8k-token prompt's routing)."""
    if text.isascii():
        words = text.encode().translate(_SEPARATORS).split()
    else:
        words = [w.encode("utf-8", "replace") for w in text.split()]
    crc = zlib.crc32
    return tuple([crc(w) & _WORD_BITS for w in words]) or (word_id(""),)


def text_ids(value: Any) -> list[int]:
    """A prompt's token ids, without a tokenizer: those of the words of a string (whitespace-separated;
    a string without any is one empty word), the items of a token-id list, those of each prompt of a
    list of prompts one after the other. Strings seen lately are remembered (long prompts repeat)."""
    if isinstance(value, str):
        return list(_words(value))
    if isinstance(value, list):
        if value and all(isinstance(v, int) for v in value):
            return value
        return [t for v in value for t in text_ids(v)]
    return []


def message_ids(messages: list[Any]) -> list[int]:
    """A chat's token ids: those of each message's text content in order (roles are not tokens)."""
    out: list[int] = []
    for message in messages:
        if not isinstance(message, dict):
            continue
        content = message.get("content")
        if isinstance(content, list):  # [{"type": "text", "text": ...}, ...]
            content = [part.get("text", "") for part in content if isinstance(part, dict)]
        if content:
            out += text_ids(content)
    return out or [word_id("")]


def load_tokenizer(directory: str | None) -> Tokenizer | None:
    """The model's tokenizer, where `directory` (its weights) has a tokenizer.json; ValueError when that
    is not a tokenizer."""
    path = Path(directory, "tokenizer.json") if directory else None
    if path is None or not path.is_file():
        return None
    import tokenizers  # only where a model has one: every llmgw command imports this module (the api's)
    try:
        return tokenizers.Tokenizer.from_file(str(path))
    except Exception as e:  # tokenizers raises Exception itself
        raise ValueError(f"{path} is not a tokenizer: {e}") from e


def _texts(value: Any) -> list[str]:
    """The texts of a prompt or of a message's content (a string, a list of them or of text parts)."""
    if isinstance(value, str):
        return [value]
    if isinstance(value, list):
        return [t for v in value for t in _texts(v.get("text") if isinstance(v, dict) else v)]
    return []


def request_token_ids(doc: Mapping[str, Any], tokenizer: Tokenizer | None = None,
                      template: ChatTemplate | None = None) -> list[int]:
    """A request body's prompt token ids, as the sim reads them (with the model's tokenizer and chat
    template, if any); ValueError where the template refuses the chat."""
    messages = doc.get("messages")
    prompt = doc.get("prompt", "")
    if tokenizer is None:
        return message_ids(messages) if isinstance(messages, list) else text_ids(prompt)
    if isinstance(messages, list) and template is not None:
        return tokenizer.encode(template.render(doc), add_special_tokens=doc.get("add_special_tokens") is True).ids
    if not isinstance(messages, list) and isinstance(prompt, list) and prompt and all(
            isinstance(t, int) for t in prompt):
        return prompt
    texts = [t for m in messages if isinstance(m, dict) for t in _texts(m.get("content"))] \
        if isinstance(messages, list) else _texts(prompt)
    ids = [i for e in tokenizer.encode_batch(texts) for i in e.ids]
    return ids or [0]  # as a prompt without words is one token

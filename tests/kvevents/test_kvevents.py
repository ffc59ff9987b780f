"""KV events as vLLM publishes them: the sim's on the wire, the gateway's index of them, precise-prefix routing.

The sim runs as a real process publishing over ZeroMQ; its batches are decoded
here with msgspec structs declared field for field as vLLM's
vllm/distributed/kv_events.py declares them (docs/contracts.md, "KV events"),
not with llmgw's decoder. The block hashes are checked against a CBOR encoding
spelled out byte by byte from RFC 8949 (what vLLM's sha256_cbor hashes: cbor2's
canonical encoding of (parent, token ids, extra keys)), not with cbor2.
"""
from __future__ import annotations

import asyncio
import hashlib
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import aiohttp
import msgpack
import msgspec
import pytest
import zmq
import zmq.asyncio

from llmgw.api import Model
from llmgw.dev.process import free_port
from llmgw.gateway.table import RoutingTable
from llmgw.kvevents import wire
from llmgw.kvevents.publisher import KVEventsConfig, Publisher
from llmgw.kvevents.subscriber import Subscription
from llmgw.routing.chattemplate import load_chat_template
from llmgw.routing.kvblocks import (
    HASH_SEED,
    BlockHasher,
    SGLangBlockHasher,
    load_tokenizer,
    request_token_ids,
    text_ids,
    word_id,
)
from llmgw.routing.kvindex import KVIndex
from llmgw.sim.kvcache import DEFAULT_SEED
from tests.fixtures import chat_model
from tests.fixtures.gateway import Sim, lora, replica, running_gateway, scrape
from tests.fixtures.poll import until
from tests.fixtures.weights_origin import origin  # noqa: F401 - a fixture

BLOCK = 4  # tokens per block: short prompts make several blocks


# vLLM's structs, as declared in vllm/distributed/kv_events.py at the commit docs/contracts.md names.
class EventBatch(msgspec.Struct, omit_defaults=True, gc=False):  # type: ignore[call-arg]
    ts: float
    events: list[Any]
    data_parallel_rank: int | None = None


class KVCacheEvent(msgspec.Struct, omit_defaults=True, gc=False, tag=True):  # type: ignore[call-arg]
    pass


class BlockStored(KVCacheEvent):
    block_hashes: list[int | bytes]
    parent_block_hash: int | bytes | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None
    medium: str | None
    lora_name: str | None
    extra_keys: list[tuple[Any, ...] | None] | None = None
    group_idx: int | None = None
    kv_cache_spec_kind: str | None = None
    kv_cache_spec_sliding_window: int | None = None


class BlockRemoved(KVCacheEvent):
    block_hashes: list[int | bytes]
    medium: str | None
    group_idx: int | None = None


class AllBlocksCleared(KVCacheEvent):
    pass


class KVEventBatch(EventBatch):
    events: list[BlockStored | BlockRemoved | AllBlocksCleared]


# SGLang's, as declared in sglang/srt/disaggregation/kv_events.py (0.5.23): its KVCacheEvent is vLLM's, its
# batch positional, its BlockStored without extra keys.
SGLangBlockStored = msgspec.defstruct("BlockStored", [
    ("block_hashes", list[int]), ("parent_block_hash", int | None), ("token_ids", list[int]), ("block_size", int),
    ("lora_id", int | None), ("medium", str | None, None), ("cache_salt", str | None, None),
    ("session_id", str | None, None), ("lora_name", str | None, None)], bases=(KVCacheEvent,), tag="BlockStored")
SGLangBlockRemoved = msgspec.defstruct("BlockRemoved", [("block_hashes", list[int]), ("medium", str | None, None)],
                                       bases=(KVCacheEvent,), tag="BlockRemoved")
SGLangCleared = msgspec.defstruct("AllBlocksCleared", [], bases=(KVCacheEvent,), tag="AllBlocksCleared")
SGLangKVEventBatch = msgspec.defstruct("KVEventBatch", [
    ("ts", float), ("events", list[SGLangBlockStored | SGLangBlockRemoved | SGLangCleared]),  # type: ignore[valid-type]
    ("attn_dp_rank", int | None, None)], array_like=True, gc=False)


VLLM_DECODER = msgspec.msgpack.Decoder(KVEventBatch)
SGLANG_DECODER = msgspec.msgpack.Decoder(SGLangKVEventBatch)
STORED_FIELDS = ["type", "block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id", "medium",
                 "lora_name", "extra_keys", "group_idx", "kv_cache_spec_kind"]


def _cbor_uint(major: int, n: int) -> bytes:
    """RFC 8949 §3: a head of major type `major` with argument n, shortest form."""
    if n < 24:
        return bytes([major << 5 | n])
    for extra, size in ((24, 1), (25, 2), (26, 4), (27, 8)):
        if n < 1 << (8 * size):
            return bytes([major << 5 | extra]) + n.to_bytes(size, "big")
    raise ValueError(n)


def _vllm_block_hash(parent: bytes, tokens: list[int]) -> bytes:
    """sha256 of the CBOR array [parent (bytes), [tokens (uints)], null], encoded by hand."""
    body = (_cbor_uint(4, 3) + _cbor_uint(2, len(parent)) + parent
            + _cbor_uint(4, len(tokens)) + b"".join(_cbor_uint(0, t) for t in tokens) + b"\xf6")
    return hashlib.sha256(body).digest()


def _events_config(pub: int, replay: int, sglang: bool = False) -> str:
    """vLLM's KVEventsConfig, or SGLang's (no enable field), as the renderers write them."""
    return json.dumps({**({} if sglang else {"enable_kv_cache_events": True}), "publisher": "zmq",
                       "endpoint": f"tcp://*:{pub}", "replay_endpoint": f"tcp://*:{replay}"})


def _sim(*extra: str, seed: str = HASH_SEED, sglang: bool = False) -> tuple[Sim, str, str]:
    """A sim publishing KV events, its hashes seeded as the renderers seed them (or with `seed`), playing
    vLLM or SGLang (--api)."""
    pub, replay = free_port(), free_port()
    sim = Sim.start("m", extra=["--block-size", str(BLOCK), "--kv-events-config", _events_config(pub, replay, sglang),
                                "--api", "sglang" if sglang else "vllm", *extra], env={"PYTHONHASHSEED": seed})
    return sim, f"tcp://127.0.0.1:{pub}", f"tcp://127.0.0.1:{replay}"


async def _complete(session: aiohttp.ClientSession, base: str, prompt: str, **more: str) -> dict[str, Any]:
    async with session.post(f"{base}/v1/completions",
                            json={"model": "m", "prompt": prompt, "max_tokens": 1, **more}) as r:
        assert r.status == 200, await r.text()
        doc: dict[str, Any] = await r.json()
        return doc


async def _followed(session: aiohttp.ClientSession, kv: KVIndex, sims: dict[str, Sim]) -> None:
    """Once an event of each engine arrived (a warm-up prompt each), the subscriptions are up."""
    for name, sim in sims.items():
        async def seen(sim: Sim = sim, name: str = name) -> bool:
            await _complete(session, f"http://{sim.endpoint}", f"warm {time.monotonic_ns()} x y z w")
            await asyncio.sleep(0.05)
            return kv.blocks_of(name) > 0
        await until(seen, f"replica {name}'s events in the gateway's index")


def test_block_hashes_are_vllms_sha256_cbor_chain():
    tokens = [1, 2, 3, 4, 500, 70000, 7, 8, 9]  # two whole blocks of 4 and a partial one
    root = hashlib.sha256(b"\x61" + HASH_SEED.encode()).digest()  # CBOR text string of length 1
    first = _vllm_block_hash(root, tokens[:4])
    second = _vllm_block_hash(first, tokens[4:8])
    want = [int.from_bytes(h, "big") & (1 << 64) - 1 for h in (first, second)]
    assert BlockHasher(4).keys(tokens) == want
    assert BlockHasher(4, seed="1").keys(tokens) != want  # the seed is part of every key
    assert BlockHasher(4).keys(tokens, held={want[0]}) == want[:1]  # no further than some replica holds
    long = list(range(37 * 4 + 3))  # 37 blocks: past the 16 hashed and remembered together, twice
    chain, parent = [], root
    for start in range(0, 37 * 4, 4):
        parent = _vllm_block_hash(parent, long[start:start + 4])
        chain.append(int.from_bytes(parent, "big") & (1 << 64) - 1)
    assert BlockHasher(4).keys(long) == chain
    assert BlockHasher(4).keys(long, held=set(chain[:20])) == chain[:20]


def test_a_words_token_id_is_the_same_however_the_text_is_split():
    """The words of a text split at once (as bytes, where it is ASCII) are str.split()'s, whitespace the
    bytes do not know (the information separators, no-break and ideographic spaces) included."""
    for text in ("plain words  here", "tab\tnew\nline\r\x0b\x0cend", "sep\x1cara\x1dted\x1eby\x1fus",
                 "no\xa0break\u3000wide \u00e9t\u00e9", "", "  ", "lone \ud800 surrogate"):
        assert text_ids(text) == ([word_id(w) for w in text.split()] or [word_id("")]), repr(text)


VLLM_HASHES = Path(__file__).parents[1] / "fixtures" / "data" / "kvblocks" / "vllm-0.34.0-block-hashes.json"


@pytest.mark.parametrize("case", json.loads(VLLM_HASHES.read_text())["cases"],
                         ids=lambda c: f"{c['block_size']}-{c['none_hash_seed']}-{'lora' if c['lora'] else 'base'}"
                                       f"{'-salted' if c['cache_salt'] else ''}")
def test_block_hashes_are_those_of_vllms_own_function(case):
    """Against a fixture made by vLLM 0.34.0's own hashing function (its "made" field says how: vLLM cannot be
    installed without a GPU's torch here): the gateway's keys of the same tokens, block size and seed, and the
    sim's default seed. Its LoRA case hashes vLLM 0.34's tagged key with the adapter's path, which the gateway
    does not know (docs/contracts.md, "KV events"): given that key the hashes agree; the adapter's name alone,
    the key of the sim and of vLLM before 0.34, gives others. A request's cache_salt is the first block's
    extra key, ("cache_salt", salt): the gateway's keys of a salted request are vLLM's, and not the unsalted."""
    hasher = BlockHasher(case["block_size"], case["none_hash_seed"])
    salt = case["cache_salt"]
    extra = tuple(tuple(k) for k in case["extra_keys"]) if case["extra_keys"] and not salt else None
    assert hasher.keys(case["token_ids"], extra, salt=salt) == case["hashes"]
    if salt:
        assert case["extra_keys"] == [["cache_salt", salt]]
        unsalted = hasher.keys(case["token_ids"])
        assert not set(unsalted) & set(case["hashes"])  # the salt reaches every block through the chain
        assert hasher.keys(case["token_ids"], held={case["hashes"][0]}, salt=salt) == case["hashes"][:1]
    if case["lora"]:
        assert hasher.keys(case["token_ids"], (case["lora"][0],)) != case["hashes"]
    if case["PYTHONHASHSEED"] is None:
        assert case["none_hash_seed"] == DEFAULT_SEED  # the sim's seed where PYTHONHASHSEED is unset


SGLANG_EVENTS = Path(__file__).parents[1] / "fixtures" / "data" / "kvblocks" / "sglang-0.5.23-block-events.json"


@pytest.mark.parametrize("case", json.loads(SGLANG_EVENTS.read_text())["cases"], ids=lambda c: c["name"])
def test_sglang_page_keys_are_those_of_sglangs_own_events(case):
    """Against batches made by SGLang 0.5.23's own KV event code (the fixture's "made" says how): they decode,
    an index following the replica as SGLang's verifies their chain from the root (salted or not, pages of 1 to
    16 tokens, a token past 32 bits), matches a request's keys on all of its pages and follows a removal; an
    adapter's pages (hashed with its load's id) are held under the gateway's keys of a request for it. Keyed as
    vLLM's, the same events are refused."""
    size, salt, lora = case["page_size"], case["cache_salt"], case["lora_name"]
    tokens = [t for node in case["nodes"] for t in node]
    batches = [wire.decode_batch(bytes.fromhex(b["msgpack_hex"])).events for b in case["batches"]]
    stored = [k for events in batches[:-1] for e in events for k in e.keys]
    kv = KVIndex()
    kv.hashes["r"] = "sha256_uint32"
    for events in batches[:-1]:
        kv.apply("r", events)
    assert kv.refused is None and kv.usable and kv.hasher is not None and kv.hasher.block_size == size
    assert kv.matches(kv.keys(tokens, lora, None if lora else salt), ["r"]) == {"r": len(tokens) // size}
    if lora:
        assert kv.verified == 0 and kv.matches(kv.keys(tokens), ["r"]) == {"r": 0}
        assert kv.hasher.keys(tokens, salt=salt) != stored  # namespaced by the load's id
    else:
        assert kv.verified == 1 and SGLangBlockHasher(size).keys(tokens, salt=salt) == stored
        assert salt is None or kv.matches(kv.keys(tokens), ["r"]) == {"r": 0}
    kv.apply("r", batches[-1])  # the last node evicted
    assert kv.matches(kv.keys(tokens, lora, None if lora else salt), ["r"]) == {"r": len(case["nodes"][0]) // size}
    as_vllm = KVIndex()
    as_vllm.apply("r", batches[0])
    assert lora or (as_vllm.refused is not None and "vLLM's sha256_cbor" in as_vllm.refused)


async def test_the_sim_publishes_vllms_layout_numbered_and_replayable():
    sim, events, replay = _sim()
    ctx = zmq.asyncio.Context.instance()
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    sub.connect(events)
    try:
        async with aiohttp.ClientSession() as session:
            async def one_batch() -> list[bytes] | None:  # a SUB misses what is sent before it joined
                await _complete(session, f"http://{sim.endpoint}", f"probe {time.monotonic_ns()} a b c d e f g")
                if await sub.poll(200):
                    frames: list[bytes] = await sub.recv_multipart()
                    return frames
                return None
            live = await until(one_batch, "a KV event batch from the sim")
            prompt = "the quick brown fox jumps over the lazy dog"  # 9 words: 2 blocks of 4
            await _complete(session, f"http://{sim.endpoint}", prompt)
            topic, seq, payload = await sub.recv_multipart()
        assert topic == live[0] == b""
        seq_n = int.from_bytes(seq, "big")
        assert seq_n == int.from_bytes(live[1], "big") + 1

        raw = msgpack.unpackb(payload)
        assert list(raw) == ["ts", "events", "data_parallel_rank"] and raw["data_parallel_rank"] == 0
        assert list(raw["events"][0]) == STORED_FIELDS
        batch = VLLM_DECODER.decode(payload)
        [stored] = batch.events
        assert isinstance(stored, BlockStored)
        ids = text_ids(prompt)
        root = hashlib.sha256(b"\x61" + HASH_SEED.encode()).digest()
        h1 = _vllm_block_hash(root, ids[:4])
        h2 = _vllm_block_hash(h1, ids[4:8])
        assert stored.block_hashes == [int.from_bytes(h, "big") & (1 << 64) - 1 for h in (h1, h2)]
        assert (stored.parent_block_hash, stored.token_ids, stored.block_size) == (None, ids[:8], BLOCK)
        assert (stored.medium, stored.lora_id, stored.extra_keys, stored.group_idx) == ("GPU", None, [None, None], 0)

        dealer = ctx.socket(zmq.DEALER)
        dealer.connect(replay)
        await dealer.send_multipart([b"", (0).to_bytes(8, "big")])
        replayed = []
        while True:
            empty, s, p = await asyncio.wait_for(dealer.recv_multipart(), 5)
            assert empty == b""
            if s == (-1).to_bytes(8, "big", signed=True):
                assert p == b""
                break
            replayed.append((int.from_bytes(s, "big"), p))
        dealer.close(linger=0)
        assert [s for s, _ in replayed] == list(range(seq_n + 1))
        assert replayed[-1][1] == payload

        async with aiohttp.ClientSession() as session:  # a salted request: its own blocks, keyed as vLLM 0.34's
            doc = await _complete(session, f"http://{sim.endpoint}", prompt, cache_salt="tenant-a")
        assert doc["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
        [salted] = VLLM_DECODER.decode((await sub.recv_multipart())[2]).events
        assert salted.block_hashes == BlockHasher(BLOCK).keys(ids, salt="tenant-a")
        assert salted.extra_keys == [("tenant-a",), None]
    finally:
        sub.close(linger=0)
        sim.stop()


async def _replayed(ctx: zmq.asyncio.Context, endpoint: str, frames: int) -> list[list[bytes]]:
    """What a replay endpoint answers a DEALER asking from batch 0, each answer's frames after b"" (the end
    marker included): `frames` of them."""
    dealer = ctx.socket(zmq.DEALER)
    dealer.connect(endpoint)
    await dealer.send_multipart([b"", (0).to_bytes(8, "big")])
    out = []
    try:
        while True:
            empty, *rest = await asyncio.wait_for(dealer.recv_multipart(), 5)
            assert empty == b"" and len(rest) == frames
            out.append(rest)
            if rest[-2] == (-1).to_bytes(8, "big", signed=True):
                return out
    finally:
        dealer.close(linger=0)


async def test_the_sim_playing_sglang_publishes_its_events_and_precise_prefix_routes_on_them(tmp_path):
    """`llmgw sim --api sglang` publishes SGLang's layout (decoded with SGLang's structs), SGLang's page keys,
    and replays a batch after its topic, as SGLang does; a gateway following two such replicas (their engine
    sglang) routes a repeated prompt, a salted one (SGLang chains it from its salt), and a request for an
    adapter (BASE:ADAPTER upstream, its blocks keyed with the id of its load), to the replica that cached it."""
    adapter = tmp_path / "sql"
    adapter.mkdir()
    (adapter / "adapter_config.json").write_text("{}")
    a, a_events, a_replay = _sim("--enable-lora", "--max-loras", "2", sglang=True)
    b, b_events, b_replay = _sim("--enable-lora", "--max-loras", "2", sglang=True)
    ctx = zmq.asyncio.Context.instance()
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    sub.connect(a_events)
    table = RoutingTable()
    table.apply("models", "ADDED", Model.model_validate({
        "metadata": {"name": "m"},
        "spec": {"profiles": [{"engine": "sglang"}], "routing": {"policy": "precise-prefix"}}}))
    for name, sim, events, replay in (("a", a, a_events, a_replay), ("b", b, b_events, b_replay)):
        table.apply("replicas", "ADDED", replica(name, "m", sim.endpoint, kv_events=events, kv_replay=replay,
                                                 engine="sglang"))
    prompt = "one two three four five six seven eight nine ten eleven twelve"  # 3 pages of 4
    ids = text_ids(prompt)
    try:
        async with aiohttp.ClientSession() as session:
            async def one_batch() -> list[bytes] | None:
                await _complete(session, f"http://{a.endpoint}", f"probe {time.monotonic_ns()} a b c d e f g")
                if await sub.poll(200):
                    frames: list[bytes] = await sub.recv_multipart()
                    return frames
                return None
            await until(one_batch, "a KV event batch from the sim")
            await _complete(session, f"http://{a.endpoint}", prompt)  # cached on a, sent there directly
            _, seq, payload = await sub.recv_multipart()
            raw = msgpack.unpackb(payload)
            assert isinstance(raw, list) and raw[2] == 0
            assert list(raw[1][0]) == ["type", "block_hashes", "parent_block_hash", "token_ids", "block_size",
                                       "lora_id", "medium"]
            [stored] = SGLANG_DECODER.decode(payload).events
            assert isinstance(stored, SGLangBlockStored)
            assert stored.block_hashes == SGLangBlockHasher(BLOCK).keys(ids)
            assert (stored.parent_block_hash, stored.token_ids, stored.block_size, stored.medium) == (
                None, ids, BLOCK, "GPU")
            replayed = await _replayed(ctx, a_replay, 3)
            assert replayed[-2] == [b"", seq, payload] and replayed[-1][0] == b""

            async with running_gateway(table) as gw:
                kv = gw.gateway.kv.index("m")
                await _followed(session, kv, {"a": a, "b": b})
                await _complete(session, f"http://{a.endpoint}", prompt)
                for _ in range(3):
                    doc = await _complete(session, gw.url, prompt)
                    assert doc["usage"]["prompt_tokens_details"]["cached_tokens"] == 12
                assert kv.refused is None and kv.verified > 0
                await _complete(session, f"http://{b.endpoint}", prompt, cache_salt="s")  # b's, under its salt
                await until(lambda: kv.matches(kv.keys(ids, salt="s"), ["a", "b"]) == {"a": 0, "b": 3},
                            "b's pages of the salted prompt")
                for _ in range(2):
                    doc = await _complete(session, gw.url, prompt, cache_salt="s")
                    assert doc["usage"]["prompt_tokens_details"]["cached_tokens"] == 12
                for sim in (a, b):
                    async with session.post(f"http://{sim.endpoint}/load_lora_adapter",
                                            json={"lora_name": "sql", "lora_path": str(adapter)}) as r:
                        assert r.status == 200 and (await r.json())["success"], await r.text()
                table.apply("adapters", "ADDED", lora("sql", "m", ("a", "b")))
                async with session.post(f"http://{b.endpoint}/v1/completions",
                                        json={"model": "m:sql", "prompt": prompt, "max_tokens": 1}) as r:
                    assert r.status == 200, await r.text()  # cached on b under the adapter
                await until(lambda: kv.matches(kv.keys(ids, "sql"), ["a", "b"]) == {"a": 0, "b": 3},
                            "b's pages of the adapter's prompt, keyed as the gateway keys them")
                for _ in range(3):
                    async with session.post(f"{gw.url}/v1/completions",
                                            json={"model": "sql", "prompt": prompt, "max_tokens": 1}) as r:
                        doc = await r.json()
                    assert doc["usage"]["prompt_tokens_details"]["cached_tokens"] == 12, doc
                assert kv.refused is None
    finally:
        sub.close(linger=0)
        a.stop()
        b.stop()


async def test_precise_prefix_follows_what_the_engines_hold_through_evictions():
    """A prompt goes where it is cached; once that engine evicted it and the other cached it
    (traffic that bypassed this gateway), it goes to the other, where prefix-score's guess would not."""
    a, a_events, a_replay = _sim("--kv-cache-tokens", "16")  # 4 blocks: a second prompt evicts the first
    b, b_events, b_replay = _sim("--kv-cache-tokens", "64")
    table = RoutingTable()
    table.apply("models", "ADDED", Model.model_validate({
        "metadata": {"name": "m"},
        "spec": {"profiles": [{"engine": "sim"}], "routing": {"policy": "precise-prefix"}}}))
    table.apply("replicas", "ADDED", replica("a", "m", a.endpoint, kv_events=a_events, kv_replay=a_replay))
    table.apply("replicas", "ADDED", replica("b", "m", b.endpoint, kv_events=b_events, kv_replay=b_replay))
    prompt = "one two three four five six seven eight nine ten eleven twelve"  # 3 blocks
    try:
        async with running_gateway(table) as gw, aiohttp.ClientSession() as session:
            kv = gw.gateway.kv.index("m")
            await _followed(session, kv, {"a": a, "b": b})
            # cached on a (sent there directly): the gateway sends it to a
            await _complete(session, f"http://{a.endpoint}", prompt)
            await until(lambda: kv.matches(kv.keys(text_ids(prompt)), ["a", "b"])["a"] == 3,
                        "a's blocks of the prompt in the index")
            for _ in range(3):
                doc = await _complete(session, gw.url, prompt)
                assert doc["usage"]["prompt_tokens_details"]["cached_tokens"] == 12
            # a evicts it (another prompt fills its 4 blocks), b caches it: the gateway follows
            await _complete(session, f"http://{a.endpoint}", "p q r s t u v w x y z zz")
            await _complete(session, f"http://{b.endpoint}", prompt)
            def moved() -> bool:  # a keeps the chain's head (the tail goes first, as in vLLM), b all of it
                held = kv.matches(kv.keys(text_ids(prompt)), ["a", "b"])
                return held["a"] < 3 and held["b"] == 3
            await until(moved, "a's eviction and b's store in the index")
            for _ in range(3):
                doc = await _complete(session, gw.url, prompt)
                assert doc["usage"]["prompt_tokens_details"]["cached_tokens"] == 12
            text = await scrape(session, gw)
            assert 'llmgw_gateway_kv_index_refused{model="m"} 0.0' in text
            assert kv.verified > 0
            # each of the six predicted the 12 cached tokens the engine then reported
            assert 'llmgw_gateway_kv_predictions_total{model="m"} 6.0' in text
            assert 'llmgw_gateway_kv_predictions_agreed_total{model="m"} 6.0' in text
            assert 'llmgw_gateway_kv_predicted_cached_tokens_error_bucket{le="-1.0",model="m"} 0.0' in text
            assert 'llmgw_gateway_kv_predicted_cached_tokens_error_bucket{le="0.0",model="m"} 6.0' in text
            # a replica that leaves routing is dropped from the index
            table.apply("replicas", "DELETED", replica("b", "m", b.endpoint, kv_events=b_events))
            assert kv.blocks_of("b") == 0
    finally:
        a.stop()
        b.stop()


async def test_a_gap_is_replayed_and_a_restart_drops_the_replicas_entries():
    pub_port, replay_port = free_port(), free_port()
    cfg = KVEventsConfig(enable_kv_cache_events=True, endpoint=f"tcp://*:{pub_port}",
                         replay_endpoint=f"tcp://*:{replay_port}")
    hasher = BlockHasher(BLOCK)
    kv = KVIndex()

    def stored(tokens: list[int]) -> dict[str, Any]:
        return wire.stored(hasher.keys(tokens), None, tokens, BLOCK)

    publisher = Publisher(cfg)
    publisher.start()
    missed = [[i, i, i, i] for i in range(5)]
    for tokens in missed:  # before anyone subscribed: lost on the PUB socket, kept for replay
        publisher.publish([stored(tokens)])
    sub = Subscription("r", f"tcp://127.0.0.1:{pub_port}", f"tcp://127.0.0.1:{replay_port}", "",
                       kv.apply, kv.drop)
    sub.start()
    try:
        async def received() -> bool:
            publisher.publish([stored([9, 9, 9, 9])])
            await asyncio.sleep(0.05)
            return sub.expected is not None
        await until(received, "a live batch at the subscriber")
        assert sub.replayed >= 5 and sub.lost == 0
        for tokens in missed:
            assert kv.matches(hasher.keys(tokens), ["r"]) == {"r": 1}

        await publisher.close()  # the engine restarts: a new process numbers its batches from 0 again
        publisher = await until(lambda: Publisher(cfg), "the ports free again", retry=(zmq.ZMQError,))
        publisher.start()
        async def restarted() -> bool:
            publisher.publish([stored([7, 7, 7, 7])])
            await asyncio.sleep(0.05)
            return kv.matches(hasher.keys([7, 7, 7, 7]), ["r"]) == {"r": 1}
        await until(restarted, "the restarted engine's events")
        assert kv.matches(hasher.keys(missed[0]), ["r"]) == {"r": 0}  # what the old process held is gone
    finally:
        await sub.close()
        await publisher.close()


def test_keys_that_cannot_match_are_refused_loudly():
    tokens = [1, 2, 3, 4]
    other_seed = KVIndex()
    other_seed.apply("r", [wire.Event("BlockStored", tuple(BlockHasher(BLOCK, seed="1").keys(tokens)), None,
                                      tuple(tokens), BLOCK)])
    assert other_seed.refused is not None and "PYTHONHASHSEED=0" in other_seed.refused
    assert not other_seed.usable
    other_seed.apply("r", [wire.Event("AllBlocksCleared")])  # the engines replaced (or cleared): checked afresh
    other_seed.apply("r", [wire.Event("BlockStored", tuple(BlockHasher(BLOCK).keys(tokens)), None, tuple(tokens),
                                      BLOCK)])
    assert other_seed.refused is None and other_seed.usable and other_seed.verified == 1
    # a replica's chains are checked until one agrees (the first after it is followed, restarts or clears),
    # not each after it: a cold 8k-token prompt's chain is 512 hashes, milliseconds of the gateway's loop
    other = [5, 6, 7, 8]
    other_seed.apply("r", [wire.Event("BlockStored", tuple(BlockHasher(BLOCK).keys(other)), None, tuple(other),
                                      BLOCK)])
    assert other_seed.verified == 1 and other_seed.matches(BlockHasher(BLOCK).keys(other), ["r"]) == {"r": 1}
    # vLLM 0.34 hashes a LoRA block with ("lora", name, path) and publishes (name,): not checked, not refused
    lora = BlockHasher(BLOCK).keys(tokens, (("lora", "sql", "/adapters/sql"),))
    other_seed.apply("r", [wire.Event("BlockStored", tuple(lora), None, tuple(tokens), BLOCK, (("sql",),))])
    assert other_seed.refused is None and other_seed.usable

    engines = KVIndex()  # a Model whose replicas are vLLM and SGLang: their keys cannot be one index's
    engines.hashes["r2"] = "sha256_uint32"
    engines.apply("r1", [wire.Event("BlockStored", tuple(BlockHasher(4).keys(tokens)), None, tuple(tokens), 4)])
    engines.apply("r2", [wire.Event("BlockStored", tuple(SGLangBlockHasher(4).keys(tokens)), None, tuple(tokens), 4)])
    assert engines.refused is not None and "SGLang's page hashes" in engines.refused

    sizes = KVIndex()
    sizes.apply("r1", [wire.Event("BlockStored", tuple(BlockHasher(4).keys(tokens)), None, tuple(tokens), 4)])
    assert sizes.usable
    sizes.apply("r2", [wire.Event("BlockStored", tuple(BlockHasher(2).keys(tokens)), None, tuple(tokens), 2)])
    assert sizes.refused is not None and "2 tokens" in sizes.refused


def test_a_lora_adapters_blocks_are_held_under_the_gateways_keys_whatever_the_engine_hashed():
    """vLLM 0.34 hashes a LoRA block with ("lora", name, path): the index holds it under the key a request for
    the adapter gets (its name alone), follows the chain's next batch by its parent, and a removal."""
    tokens = list(range(1, 13))  # 3 blocks
    engine = BlockHasher(BLOCK).keys(tokens, (("lora", "sql", "/adapters/sql"),))
    kv = KVIndex()
    base = (9, 9, 9, 9)
    kv.apply("r", [wire.Event("BlockStored", tuple(BlockHasher(BLOCK).keys(base)), None, base, BLOCK)])
    kv.apply("r", [wire.Event("BlockStored", tuple(engine[:2]), None, tuple(tokens[:8]), BLOCK, (("sql",),) * 2,
                              "sql")])
    kv.apply("r", [wire.Event("BlockStored", (engine[2],), engine[1], tuple(tokens[8:]), BLOCK, (("sql",),), "sql")])
    assert kv.matches(kv.keys(tokens, "sql"), ["r"]) == {"r": 3}
    assert kv.matches(kv.keys(tokens), ["r"]) == {"r": 0}  # the base model's keys of the same tokens
    kv.apply("r", [wire.Event("BlockRemoved", (engine[2],))])
    assert kv.matches(kv.keys(tokens, "sql"), ["r"]) == {"r": 2} and kv.blocks_of("r") == 3
    assert kv.refused is None


def test_precise_prefix_weighs_the_prefill_a_hit_saves_against_the_work_in_flight():
    from llmgw.api import RoutingSpec
    from llmgw.gateway.table import Backend
    from llmgw.routing.precise_prefix import PrecisePrefix

    policy = PrecisePrefix(RoutingSpec(policy="precise-prefix"))
    policy.kv = kv = KVIndex()
    context = list(range(1, 41))  # 10 blocks, held by a
    kv.apply("a", [wire.Event("BlockStored", tuple(BlockHasher(BLOCK).keys(context)), None, tuple(context), BLOCK)])
    replicas = [Backend("a", "m", "127.0.0.1:1"), Backend("b", "m", "127.0.0.1:2")]
    inflight = {"a": 3, "b": 0}  # past prefix-score's load bound (ceil(1.25 x 4 / 2) = 3) at a

    def pick(question: int) -> str:  # 2 blocks of a question of its own: 12 blocks, 2 of them lacking at a
        prompt = {"prompt": context + [question] * (2 * BLOCK)}
        best = policy.pick(replicas, inflight, policy.key(prompt, None))
        assert best is not None
        return best.replica

    # a lacks 2 blocks, b 12: a, until (a being at the bound) the 2 blocks each request in flight there
    # lacked add up to as many as b lacks (then the fewer requests in flight)
    assert [pick(q) for q in range(6)] == ["a"] * 5 + ["b"]
    policy.done("a")  # one of a's ended
    assert pick(6) == "a"  # 4 x 2 + 2 against 12 + 12
    policy.done("b")
    assert pick(7) == "b"  # 5 x 2 + 2 against 12: the fewer in flight
    policy.done("b")
    kv.apply("a", [wire.Event("BlockStored", (1, 2, 3, 4), None, (), BLOCK)])  # a admitted some: 4 blocks begun
    assert pick(8) == "a"  # (10 - 4) + 2 against 12: queued work only
    inflight["a"] = 1  # within the bound (ceil(1.25 x 2 / 2) = 2): a's queued work does not count
    assert [pick(q) for q in range(9, 14)] == ["a"] * 5


async def test_a_sim_seeded_otherwise_is_refused_and_routing_falls_back():
    sim, events, replay = _sim(seed="1")
    table = RoutingTable()
    table.apply("models", "ADDED", Model.model_validate({
        "metadata": {"name": "m"},
        "spec": {"profiles": [{"engine": "sim"}], "routing": {"policy": "precise-prefix"}}}))
    table.apply("replicas", "ADDED", replica("a", "m", sim.endpoint, kv_events=events, kv_replay=replay))
    try:
        async with running_gateway(table) as gw, aiohttp.ClientSession() as session:
            kv = gw.gateway.kv.index("m")
            async def refused() -> bool:
                await _complete(session, gw.url, f"x {time.monotonic_ns()} a b c d e f")
                await asyncio.sleep(0.05)
                return kv.refused is not None
            await until(refused, "the index to refuse the sim's keys")
            assert 'llmgw_gateway_kv_index_refused{model="m"} 1.0' in await scrape(session, gw)
            await _complete(session, gw.url, "still routed")  # as prefix-score
    finally:
        sim.stop()


async def test_a_models_tokenizer_and_chat_template_key_requests_in_the_sim_and_the_gateway_alike(tmp_path):
    """A model with a tokenizer.json and Llama-3's chat template (tests/fixtures/chat_model.py): the
    gateway's token ids of a chat are the sim's (which renders it as vLLM does), with one
    <|begin_of_text|> (the template's: the tokenizer's post-processor does not add another), and a
    repeated chat goes to the replica that cached it, for the model or a LoRA adapter of it (whose name
    is an extra key of each block, as in vLLM); a completion's prompt gets the post-processor's BOS."""
    model = str(chat_model.write(tmp_path))
    a, a_events, a_replay = _sim("--model", model, "--enable-lora")
    b, b_events, b_replay = _sim("--model", model, "--enable-lora")
    table = RoutingTable()
    table.apply("models", "ADDED", Model.model_validate({
        "metadata": {"name": "m"},
        "spec": {"source": model, "profiles": [{"engine": "sim"}], "routing": {"policy": "precise-prefix"}}}))
    table.apply("replicas", "ADDED", replica("a", "m", a.endpoint, kv_events=a_events, kv_replay=a_replay))
    table.apply("replicas", "ADDED", replica("b", "m", b.endpoint, kv_events=b_events, kv_replay=b_replay))
    chat = {"model": "m", "max_tokens": 1, "messages": [
        {"role": "system", "content": "you are a helpful bot . the tenant context says alpha beta gamma delta"},
        {"role": "user", "content": [{"type": "text", "text": "what is it about ?"}]}]}
    try:
        async with running_gateway(table) as gw, aiohttp.ClientSession() as session:
            kv = gw.gateway.kv.index("m")
            ids = kv.token_ids(chat)
            async with session.post(f"http://{a.endpoint}/tokenize", json=chat) as r:
                assert (await r.json())["tokens"] == ids
            assert ids[0] == chat_model.BOS and ids.count(chat_model.BOS) == 1 and len(ids) == 31
            assert ids != request_token_ids(chat, kv.tokenizer)  # the template's tokens are in the key
            words = "alpha beta gamma delta epsilon zeta eta theta"
            assert kv.token_ids({"prompt": words})[:2] == [chat_model.BOS, chat_model.vocabulary()["alpha"]]
            assert (await _complete(session, f"http://{a.endpoint}", words))["usage"]["prompt_tokens"] == 9
            await _followed(session, kv, {"a": a, "b": b})
            async with session.post(f"http://{b.endpoint}/v1/chat/completions", json=chat) as r:
                assert r.status == 200, await r.text()  # cached on b, sent there directly
            blocks = len(ids) // BLOCK
            await until(lambda: kv.matches(kv.keys(ids), ["a", "b"]) == {"a": 0, "b": blocks},
                        "b's blocks of the chat, keyed as the gateway keys them")
            for _ in range(3):
                async with session.post(f"{gw.url}/v1/chat/completions", json=chat) as r:
                    doc = await r.json()
                assert doc["usage"]["prompt_tokens_details"]["cached_tokens"] == blocks * BLOCK, doc
            for sim in (a, b):
                async with session.post(f"http://{sim.endpoint}/v1/load_lora_adapter",
                                        json={"lora_name": "sql", "lora_path": model}) as r:
                    assert r.status == 200, await r.text()
            table.apply("adapters", "ADDED", lora("sql", "m", ("a", "b")))
            sql = {**chat, "model": "sql"}
            async with session.post(f"http://{a.endpoint}/v1/chat/completions", json=sql) as r:
                assert r.status == 200, await r.text()  # cached on a under the adapter; b has the base's
            await until(lambda: kv.matches(kv.keys(ids, "sql"), ["a", "b"]) == {"a": blocks, "b": 0},
                        "a's blocks of the adapter's chat, keyed with the adapter's name")
            for _ in range(3):
                async with session.post(f"{gw.url}/v1/chat/completions", json=sql) as r:
                    doc = await r.json()
                assert doc["usage"]["prompt_tokens_details"]["cached_tokens"] == blocks * BLOCK, doc
            assert kv.verified > 0 and kv.refused is None  # the adapter's chains checked with their keys
    finally:
        a.stop()
        b.stop()


async def test_a_hub_models_tokenizer_files_are_fetched_and_never_its_weights(tmp_path, origin, monkeypatch, caplog):
    """A precise-prefix Model from the hub (hf://): the gateway asks the hub (HF_ENDPOINT, here the fixture
    speaking the endpoints huggingface_hub calls) for the tokenizer files alone, and keys as with them
    locally; a Model routed otherwise is not asked for."""
    files = {p.name: p.read_bytes() for p in chat_model.write(tmp_path / "local").iterdir()}
    origin.add_repo("org/chat", {**files, "model.safetensors": bytes(4096)})
    origin.add_repo("org/other", files)
    monkeypatch.setenv("HF_ENDPOINT", origin.url)
    table = RoutingTable()
    for name, source, policy in (("m", "hf://org/chat", "precise-prefix"), ("gone", "hf://org/missing@v1",
                                 "precise-prefix"), ("other", "hf://org/other", "prefix-score")):
        table.apply("models", "ADDED", Model.model_validate({"metadata": {"name": name}, "spec": {
            "source": source, "profiles": [{"engine": "sim"}], "routing": {"policy": policy}}}))
    async with running_gateway(table) as gw:
        kv, gone = gw.gateway.kv.index("m"), gw.gateway.kv.index("gone")
        await until(lambda: kv.template is not None, "the hub's tokenizer files loaded")
        local = KVIndex()
        local.tokenizer = load_tokenizer(str(tmp_path / "local"))
        local.template = load_chat_template(tmp_path / "local")
        chat = {"messages": [{"role": "user", "content": "hello alpha beta gamma"}]}
        assert kv.token_ids(chat) == local.token_ids(chat) != request_token_ids(chat, kv.tokenizer)
        assert origin.requests(suffix="/tokenizer.json") and not [r for r in origin.log if "safetensors" in r.path]
        await until(lambda: "hf://org/missing@v1" in caplog.text, "the missing repository's warning")
        assert gone.tokenizer is None and gone.token_ids(chat) == text_ids(["hello alpha beta gamma"])
        assert not [r for r in origin.log if "org/other" in r.path]


@pytest.mark.parametrize("config, error", [
    ("{", "not JSON"),
    ('{"enable_kv_cache_events": true, "endpoit": "tcp://*:1"}', "unknown field(s) endpoit"),
    ('{"publisher": "kafka"}', "publisher 'kafka'"),
])
def test_a_bad_kv_events_config_is_one_line(config, error):
    r = subprocess.run([sys.executable, "-m", "llmgw.sim", "--host", "127.0.0.1", "--port", "1",
                        "--served-model-name", "m", "--kv-events-config", config],
                       capture_output=True, text=True, timeout=30)
    assert r.returncode == 2
    assert f"--kv-events-config: {error}" in r.stderr and "Traceback" not in r.stderr

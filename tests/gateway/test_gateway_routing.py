"""Cache-aware routing: prefix keys, prefix-hash (CHWBL) and prefix-score choices, the prefix
index's memory bound, and both policies end to end through a gateway to real sim engines."""
from __future__ import annotations

import json
import random
import tracemalloc
from functools import cache

import aiohttp
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from llmgw.api import Model, RoutingSpec
from llmgw.gateway.balancer import Balancer
from llmgw.gateway.proxy import REPLICA_HEADER
from llmgw.gateway.table import Backend, RoutingTable
from llmgw.routing import prefix
from llmgw.routing.prefixindex import PrefixIndex
from llmgw.routing.ring import load_bound
from tests.fixtures.gateway import Sim, replica, running_gateway

SCORE = RoutingSpec(policy="prefix-score")


@cache
def hash_routing(bound: float = 1.25) -> RoutingSpec:
    return RoutingSpec(policy="prefix-hash", loadBound=bound)


def pick_hashed(bal: Balancer, bs: list[Backend], key: int, bound: float = 1.25, exclude=()) -> Backend | None:
    """prefix-hash's choice for `key`, as the gateway owning `bal` makes it for model m."""
    return bal.policy("m", hash_routing(bound)).pick(bs, bal.inflight, key, exclude)


def pick_scored(bal: Balancer, bs: list[Backend], blocks: list[int], routing: RoutingSpec = SCORE) -> Backend | None:
    return bal.policy("m", routing).pick(bs, bal.inflight, blocks)


def backends(*names: str) -> list[Backend]:
    return [Backend(n, "m", f"127.0.0.1:{i + 1}") for i, n in enumerate(names)]


def chat(system: str, question: str, **extra) -> dict:
    return {"model": "m", "messages": [{"role": "system", "content": system},
                                       {"role": "user", "content": question}], **extra}


def keys(n: int, seed: int = 1) -> list[int]:
    rnd = random.Random(seed)
    return [rnd.getrandbits(64) for _ in range(n)]


# ------------------------------------------------------------------ prefix keys

def test_the_key_is_the_first_bytes_of_the_rendered_prompt():
    long = "x" * 3000
    a = prefix.key_hash(chat(long, "one question"), None, 2048)
    assert a == prefix.key_hash(chat(long, "another question"), None, 2048)  # differs past 2048 bytes
    assert a != prefix.key_hash(chat("y" + long, "one question"), None, 2048)
    assert prefix.key_hash(chat("s", "one"), None, 2048) != prefix.key_hash(chat("s", "two"), None, 2048)
    # roles count: a chat is rendered role by role, not as its JSON
    assert prefix.render(chat("a", "b"), 100) == b"system\na\nuser\nb\n"
    assert prefix.render({"prompt": ["first", "second"]}, 3) == b"fir"
    assert prefix.render({"prompt": [1, 2, 3]}, 100) == b"1,2,3"
    assert prefix.render({"messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}]},
                         100) == b"user\nhi\n"


def test_blocks_are_chained_so_a_shared_beginning_shares_leading_blocks():
    base = "w" * (prefix.BLOCK_BYTES * 3)
    a = prefix.key_blocks({"prompt": base + "aaaa"}, None, 4096)
    b = prefix.key_blocks({"prompt": base + "bbbb"}, None, 4096)
    assert len(a) == 4 and a[:3] == b[:3] and a[3] != b[3]
    assert len(prefix.key_blocks({"prompt": "z" * 10_000}, None, 1024)) == 1024 // prefix.BLOCK_BYTES


def test_a_session_header_or_user_field_replaces_the_prefix():
    one, two = chat("s", "first turn"), chat("other system prompt", "a later turn")
    assert prefix.key_hash(one, b"sess-1", 2048) == prefix.key_hash(two, b"sess-1", 2048)
    assert prefix.key_hash(one, b"sess-1", 2048) != prefix.key_hash(one, b"sess-2", 2048)
    assert prefix.key_hash({**one, "user": "u1"}, None, 2048) == prefix.key_hash({**two, "user": "u1"}, None, 2048)
    assert prefix.key_hash({**one, "user": "u1"}, b"h", 2048) == prefix.key_hash(two, b"h", 2048)  # header first
    assert prefix.key_blocks(one, b"sess-1", 2048)[0] != prefix.key_blocks(one, None, 2048)[0]


# ------------------------------------------------------------------ prefix-hash (CHWBL)

def test_prefix_hash_sends_a_key_to_the_same_replica_in_every_gateway():
    bs = backends("r0", "r1", "r2", "r3")
    one, two = Balancer(), Balancer()  # two gateways sharing nothing
    picks = [pick_hashed(one, bs, k, 1.25).replica for k in keys(400)]
    assert picks == [pick_hashed(two, list(bs), k, 1.25).replica for k in keys(400)]
    assert picks == [pick_hashed(one, bs, k, 1.25).replica for k in keys(400)]
    assert set(picks) == {"r0", "r1", "r2", "r3"}  # the keys spread over all of them


def test_a_replica_that_joins_or_leaves_moves_only_its_own_keys():
    ks = keys(4000)
    four = backends("r0", "r1", "r2", "r3")
    five = backends("r0", "r1", "r2", "r3", "r4")
    bal = Balancer()
    before = {k: pick_hashed(bal, four, k, 1.25).replica for k in ks}
    after = {k: pick_hashed(bal, five, k, 1.25).replica for k in ks}
    moved = [k for k in ks if before[k] != after[k]]
    assert all(after[k] == "r4" for k in moved)  # only to the newcomer
    assert 0.1 < len(moved) / len(ks) < 0.3  # about 1/5 of them
    back = {k: pick_hashed(bal, four, k, 1.25).replica for k in ks}
    assert back == before  # r4 leaves: exactly its keys go back where they were
    three = backends("r0", "r2", "r3")
    gone = {k: pick_hashed(bal, three, k, 1.25).replica for k in ks}
    assert all(gone[k] == before[k] for k in ks if before[k] != "r1")


def _pick_hashed(bal: Balancer, bs: list[Backend], which: int, c: float) -> Backend | None:
    return pick_hashed(bal, bs, which, c)


@cache
def score_routing(bound: float) -> RoutingSpec:
    return RoutingSpec(policy="prefix-score", loadBound=bound)


def _pick_scored(bal: Balancer, bs: list[Backend], which: int, c: float) -> Backend | None:
    blocks = prefix.key_blocks({"prompt": f"prompt {which} " * 60}, None, 2048)
    return pick_scored(bal, bs, blocks, score_routing(c))


@pytest.mark.parametrize("pick", [_pick_hashed, _pick_scored])
@settings(max_examples=50, deadline=None)
@given(st.lists(st.tuples(st.booleans(), st.integers(0, 2**64 - 1)), min_size=1, max_size=250),
       st.sampled_from([1.0, 1.1, 1.25, 2.0]), st.integers(1, 6))
def test_no_replica_is_pushed_past_its_load_bound(pick, ops, c, n):
    """Whatever the prefixes (few of them: hot spots the bound must spread) and whenever
    requests end, a pick leaves its replica at most at ceil(c x (in flight + 1) / n)."""
    bs = backends(*(f"r{i}" for i in range(n)))
    bal, held = Balancer(), []
    for finish, key in ops:
        if finish and held:
            bal.release(held.pop(key % len(held)))
            continue
        total = sum(bal.inflight.values())
        b = pick(bal, bs, key % 7, c)
        bal.acquire(b)
        held.append(b)
        assert bal.inflight[b.replica] <= load_bound(total, n, c)


def test_prefix_hash_skips_excluded_replicas():
    bs = backends("r0", "r1")
    bal = Balancer()
    for k in keys(50):
        first = pick_hashed(bal, bs, k, 1.25)
        assert pick_hashed(bal, bs, k, 1.25, exclude=[first.replica]).replica != first.replica
    assert pick_hashed(bal, bs, 1, 1.25, exclude=["r0", "r1"]) is None


# ------------------------------------------------------------------ prefix-score

def test_prefix_score_follows_the_prefix_and_spreads_the_rest():
    bs = backends("r0", "r1", "r2", "r3")
    bal = Balancer()
    system = "a long shared system prompt " * 40
    first = pick_scored(bal, bs, prefix.key_blocks(chat(system, "q0"), None, 2048), SCORE)
    for i in range(1, 20):  # one at a time: the load is 0 each time
        b = pick_scored(bal, bs, prefix.key_blocks(chat(system, f"q{i}"), None, 2048), SCORE)
        assert b is first
    uniques = {pick_scored(bal, bs, prefix.key_blocks({"prompt": f"unique {i}"}, None, 2048),
                               SCORE).replica for i in range(8)}
    assert uniques == {"r0", "r1", "r2", "r3"}  # no match anywhere: equal scores take turns


def test_prefix_score_gives_way_to_load_at_the_bound():
    bs = backends("r0", "r1")
    bal = Balancer()
    blocks = prefix.key_blocks({"prompt": "same prompt " * 100}, None, 2048)
    picks = []
    for _ in range(6):  # nothing finishes: the prefix's replica fills to its bound, then the other
        b = pick_scored(bal, bs, blocks)
        bal.acquire(b)
        picks.append(b.replica)
    assert picks[0] == picks[1] and set(picks) == {"r0", "r1"}
    assert max(bal.inflight.values()) <= load_bound(5, 2, SCORE.loadBound)


# ------------------------------------------------------------------ the index

def test_the_index_forgets_the_least_recently_used_prefixes():
    index = PrefixIndex(65536)
    cap = index.max_entries
    index.record([1, 2], "r0")
    index.record(list(range(100, 100 + cap - 2)), "r1")  # full now
    assert index.matches([1, 2], ["r0", "r1"]) == {"r0": 2, "r1": 0}
    index.record([1], "r1")  # touched: 1 is now the most recent, 2 the least
    index.record([999], "r1")
    assert len(index) == cap
    assert index.matches([1, 2], ["r0", "r1"]) == {"r0": 1, "r1": 1}


@pytest.mark.parametrize("max_bytes", [65536, 300_000, 1 << 20, 3_000_000, 5_000_000])
def test_the_index_stays_under_its_memory_bound(max_bytes):
    rnd = random.Random(max_bytes)
    names = [f"model-replica-{i}" for i in range(64)]  # the most bits a mask gets
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        index = PrefixIndex(max_bytes)
        for i in range(index.max_entries * 2):
            index.record([rnd.getrandbits(64)], names[i % len(names)])
        used = tracemalloc.get_traced_memory()[0] - base
    finally:
        tracemalloc.stop()
    assert len(index) == index.max_entries
    assert used <= max_bytes, f"{used} bytes for an index bounded at {max_bytes}"


# ------------------------------------------------------------------ end to end

@pytest.fixture(scope="module")
def engines():
    started = [Sim.start("m", extra=["--block-size", "4"]) for _ in range(3)]
    yield started
    for s in started:
        s.stop()


def routed_table(policy: str, engines) -> RoutingTable:
    t = RoutingTable()
    t.apply("models", "ADDED", Model.model_validate({
        "metadata": {"name": "m"},
        "spec": {"profiles": [{"engine": "sim"}], "routing": {"policy": policy}}}))
    for i, s in enumerate(engines):
        t.apply("replicas", "ADDED", replica(f"m-{i}", "m", s.endpoint, served=("m",)))
    return t


@pytest.mark.parametrize("policy", ["prefix-hash", "prefix-score"])
async def test_a_conversation_stays_on_one_engine_and_hits_its_cache(engines, policy):
    async with running_gateway(routed_table(policy, engines)) as gw:
        assert gw.table.routing("m").policy == policy
        async with aiohttp.ClientSession() as session:
            async def ask(body, headers=None):
                async with session.post(gw.url + "/v1/chat/completions", data=json.dumps(body),
                                        headers={"Content-Type": "application/json", **(headers or {})}) as r:
                    assert r.status == 200
                    return r.headers[REPLICA_HEADER], json.loads(await r.read())["usage"]

            system = " ".join(f"{policy}-word{i}" for i in range(600))  # past prefixBytes
            seen, hits = set(), []
            for turn in range(4):
                where, usage = await ask(chat(system, f"question {turn}", max_tokens=1))
                seen.add(where)
                hits.append(usage["prompt_tokens_details"]["cached_tokens"])
            assert len(seen) == 1 and hits[0] == 0 and min(hits[1:]) >= 600
            for user in ("ann", "bob"):  # a session sticks whatever its prompts
                where = {(await ask(chat(f"{user} {i}", "x", user=user, max_tokens=1)))[0] for i in range(3)}
                assert len(where) == 1
            where = {(await ask(chat(f"{i}", "x", max_tokens=1), {"X-Session-Id": "s1"}))[0] for i in range(3)}
            assert len(where) == 1


def test_least_outstanding_stays_the_default_and_a_policy_change_is_a_routing_change():
    def m(routing: dict | None = None) -> Model:
        spec = {"profiles": [{"engine": "sim"}], **({"routing": routing} if routing else {})}
        return Model.model_validate({"metadata": {"name": "m"}, "spec": spec})

    t = RoutingTable()
    t.apply("models", "ADDED", m())
    assert t.routing("m").policy == "least-outstanding"
    assert t.apply("models", "MODIFIED", m({"policy": "prefix-hash", "loadBound": 1.5}))
    assert (t.routing("m").policy, t.routing("m").loadBound) == ("prefix-hash", 1.5)
    assert not t.apply("models", "MODIFIED", m({"policy": "prefix-hash", "loadBound": 1.5}))
    assert t.apply("models", "MODIFIED", m({"policy": "least-outstanding"}))
    assert t.routing("m").policy == "least-outstanding"
    with pytest.raises(ValueError, match="policy"):
        Model.model_validate({"metadata": {"name": "m"},
                              "spec": {"profiles": [{"engine": "sim"}], "routing": {"policy": "random"}}})

"""Claims on GPUs and ports (llmgw.agent.claims): what overlaps, and who waits for whom."""
from __future__ import annotations

import asyncio

from llmgw.agent.claims import Claim, Claims


def test_overlap_names_what_is_shared():
    a = Claim("shard a", [0, 1], [30000, 30001])
    assert a.overlap(Claim("shard b", [1], [30001])) == "GPU 1 and port 30001"
    assert a.overlap(Claim("shard c", [2], [30002])) == ""
    assert a.overlap(Claim("shard c", [], [])) == ""
    old = Claim("shard old", None, None)        # a record written before GPUs and ports were kept
    assert old.overlap(a) == "GPUs [0, 1] and ports [30000, 30001]"
    assert old.overlap(Claim("shard d", None, [])) == "any GPUs"


async def test_a_claim_waits_for_the_first_list_and_for_overlapping_engines_to_be_gone():
    claims = Claims()
    old = claims.add(Claim("shard old", [0], [30000], held=True))
    other = claims.add(Claim("shard other", [1], [30005], held=True))
    new = claims.add(Claim("shard new", [0], [30001]))
    said: list[str] = []
    turn = asyncio.ensure_future(claims.wait_turn(new, said.append))
    await asyncio.sleep(0)
    assert not turn.done() and said == []        # before the first list nothing starts
    claims.ready.set()
    await asyncio.sleep(0)
    assert not turn.done()
    assert said == ["waiting for the engine of shard old to stop: it holds GPU 0"]
    old.release()
    await asyncio.wait_for(turn, 5)
    assert not new.released.is_set(), "the claim is held as the turn comes"
    assert not other.released.is_set()
    # a later claim on the same GPU now waits for the new one
    later = claims.add(Claim("shard later", [0], [30009]))
    assert claims.blocker(later) == (new, "GPU 0")

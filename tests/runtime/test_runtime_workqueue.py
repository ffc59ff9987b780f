"""WorkQueue semantics: dedup, one worker per key, dirty re-queue, backoff, delays."""
import asyncio

from llmgw.runtime.workqueue import QueueStats, WorkQueue


async def test_add_dedups_waiting_keys():
    q = WorkQueue()
    for k in ["a", "b", "a", "a", "b"]:
        q.add(k)
    assert len(q) == 2
    assert [await q.get(), await q.get()] == ["a", "b"]


async def test_key_added_while_processing_is_reprocessed_after_done_not_before():
    q = WorkQueue()
    q.add("a")
    assert await q.get() == "a"
    q.add("a")
    q.add("a")
    assert len(q) == 0          # not handed to a second worker meanwhile
    getter = asyncio.ensure_future(q.get())
    await asyncio.sleep(0)
    assert not getter.done()
    q.done("a")
    assert await asyncio.wait_for(getter, 5) == "a"
    q.done("a")
    assert len(q) == 0 and q.processing == 0


async def test_concurrent_workers_never_hold_the_same_key():
    q = WorkQueue()
    holding: set[str] = set()
    overlaps = []
    counts: dict[str, int] = {}

    async def worker():
        while (key := await q.get()) is not None:
            if key in holding:
                overlaps.append(key)
            holding.add(key)
            counts[key] = counts.get(key, 0) + 1
            await asyncio.sleep(0)
            if counts[key] < 3:
                q.add(key)       # re-added while processing
            await asyncio.sleep(0)
            holding.discard(key)
            q.done(key)

    workers = [asyncio.ensure_future(worker()) for _ in range(4)]
    for k in "abcde":
        q.add(k)
    deadline = asyncio.get_running_loop().time() + 10
    while any(counts.get(k, 0) < 3 for k in "abcde"):
        assert asyncio.get_running_loop().time() < deadline
        await asyncio.sleep(0.01)
    q.shutdown()
    await asyncio.gather(*workers)
    assert overlaps == []
    assert all(counts[k] == 3 for k in "abcde")


def within_jitter(delays, ceilings):
    """Each delay is its ceiling less up to half of it (llmgw.backoff's jitter)."""
    return all(c / 2 <= d <= c for d, c in zip(delays, ceilings, strict=True))


async def test_rate_limited_backoff_doubles_caps_and_forget_resets():
    q = WorkQueue(base_delay=0.005, max_delay=0.04)
    delays = [q.add_rate_limited("k") for _ in range(6)]
    assert within_jitter(delays, [0.005, 0.01, 0.02, 0.04, 0.04, 0.04])
    assert q.num_requeues("k") == 6
    q.forget("k")
    assert q.num_requeues("k") == 0
    assert await asyncio.wait_for(q.get(), 5) == "k"   # the delayed add fired once
    q.done("k")
    assert len(q) == 0
    assert within_jitter([q.add_rate_limited("k")], [0.005])   # forgotten: from the start again


async def test_default_backoff_is_5ms_doubling_to_5_minutes():
    q = WorkQueue()
    delays = [q.add_rate_limited("x") for _ in range(30)]
    assert within_jitter(delays[:2], [0.005, 0.01])
    assert within_jitter(delays[-1:], [300.0])
    q.shutdown()


async def test_add_after_keeps_the_earliest_delay():
    q = WorkQueue()
    q.add_after("k", 3600)
    q.add_after("k", 0.01)
    q.add_after("k", 7200)
    assert await asyncio.wait_for(q.get(), 5) == "k"


async def test_shutdown_wakes_getters():
    q = WorkQueue()
    getter = asyncio.ensure_future(q.get())
    await asyncio.sleep(0)
    q.shutdown()
    assert await asyncio.wait_for(getter, 5) is None
    q.add("x")
    assert len(q) == 0


async def test_stats_count_adds_but_not_dedups_retries_and_each_keys_wait():
    waits: list[float] = []
    q = WorkQueue(stats=QueueStats(waits.append))
    for k in ["a", "b", "a"]:
        q.add(k)
    assert q.stats.adds == 2          # the second "a" was deduped
    assert await q.get() == "a"
    q.add("a")                        # while processing: counted, queued again at done
    q.done("a")
    assert q.stats.adds == 3
    assert [await q.get(), await q.get()] == ["b", "a"]
    assert len(waits) == 3 and all(w >= 0 for w in waits)
    q.add_rate_limited("a")
    q.add_rate_limited("a")
    assert q.stats.retries == 2

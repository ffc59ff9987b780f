"""The one retry policy: jittered exponential backoff (llmgw.backoff)."""
import pytest
from tenacity import AsyncRetrying, retry_if_exception_type, stop_after_attempt

from llmgw.backoff import Backoff, ExponentialJitter


def ceilings(initial, maximum, n):
    return [min(initial * 2 ** i, maximum) for i in range(n)]


def test_each_wait_lies_in_the_upper_half_of_its_doubling_capped_ceiling():
    for _ in range(200):
        b = Backoff(0.1, 1.0)
        waits = [b.next() for _ in range(8)]
        for wait, ceiling in zip(waits, ceilings(0.1, 1.0, 8), strict=True):
            assert ceiling / 2 <= wait <= ceiling


def test_waits_grow_until_the_cap():
    b = Backoff(1.0, 64.0, jitter=0.0)
    assert [b.next() for _ in range(9)] == [1, 2, 4, 8, 16, 32, 64, 64, 64]
    assert b.failures == 9


def test_the_waits_are_jittered():
    waits = {Backoff(1.0, 10.0).next() for _ in range(50)}
    assert len(waits) > 40          # fifty loops failing together do not come back together
    assert all(0.5 <= w <= 1.0 for w in waits)


def test_reset_starts_over():
    b = Backoff(1.0, 100.0, jitter=0.0)
    for _ in range(5):
        b.next()
    b.reset()
    assert b.failures == 0 and b.next() == 1.0


def test_a_long_failure_streak_stays_at_the_cap():
    b = Backoff(0.005, 300.0)
    for _ in range(2000):
        wait = b.next()
    assert 150.0 <= wait <= 300.0


@pytest.mark.parametrize("initial, maximum, jitter", [(0, 1, 0.5), (2, 1, 0.5), (1, 2, 1.0), (1, 2, -0.1)])
def test_nonsense_settings_are_refused(initial, maximum, jitter):
    with pytest.raises(ValueError):
        Backoff(initial, maximum, jitter)


async def test_it_is_a_tenacity_wait_strategy():
    slept = []

    async def sleep(seconds):
        slept.append(seconds)

    tries = 0
    with pytest.raises(OSError):
        async for attempt in AsyncRetrying(wait=ExponentialJitter(0.2, 1.0), stop=stop_after_attempt(5),
                                           retry=retry_if_exception_type(OSError), sleep=sleep, reraise=True):
            with attempt:
                tries += 1
                raise OSError("down")
    assert tries == 5
    for wait, ceiling in zip(slept, ceilings(0.2, 1.0, 4), strict=True):
        assert ceiling / 2 <= wait <= ceiling

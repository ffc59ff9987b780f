"""The gateway's latency and token series, through a real gateway and a real sim engine."""
from __future__ import annotations

import json

import aiohttp
import pytest

from llmgw.gateway.metrics import Metrics
from tests.fixtures.gateway import Sim, metric, running_gateway, scrape
from tests.gateway.test_gateway_server import table_for

TTFT_MS = 300  # the sim's time to first token: a floor under the gateway's


@pytest.fixture(scope="module")
def sim():
    s = Sim.start("llama", extra=["--tokens-per-second", "100", "--ttft-ms", str(TTFT_MS)])
    yield s
    s.stop()


async def chat(s: aiohttp.ClientSession, url: str, **extra) -> bytes:
    body = {"model": "llama", "messages": [{"role": "user", "content": "one two three"}], **extra}
    async with s.post(url + "/v1/chat/completions", json=body) as r:
        assert r.status == 200
        return await r.read()


async def test_a_whole_response_counts_its_tokens_and_no_first_token(sim):
    async with running_gateway(table_for(sim.endpoint)) as gw, aiohttp.ClientSession() as s:
        usage = json.loads(await chat(s, gw.url, max_tokens=3))["usage"]
        text = await scrape(s, gw)
    assert usage["completion_tokens"] == 3
    assert metric(text, "llmgw_gateway_input_tokens_total", model="llama") == usage["prompt_tokens"] > 0
    assert metric(text, "llmgw_gateway_output_tokens_total", model="llama") == 3
    assert metric(text, "llmgw_gateway_request_duration_seconds_count", model="llama") == 1
    assert metric(text, "llmgw_gateway_time_to_first_token_seconds_count", model="llama") == 0


async def test_a_stream_times_its_first_token_and_with_usage_its_output_tokens(sim):
    async with running_gateway(table_for(sim.endpoint)) as gw, aiohttp.ClientSession() as s:
        raw = await chat(s, gw.url, max_tokens=5, stream=True, stream_options={"include_usage": True})
        assert raw.count(b'"prompt_tokens"') == 1
        text = await scrape(s, gw)
        assert metric(text, "llmgw_gateway_time_to_first_token_seconds_count", model="llama") == 1
        # The role's chunk comes with the first token (as vLLM's), so the gateway's first chunk
        # waits out the engine's time to first token.
        assert metric(text, "llmgw_gateway_time_to_first_token_seconds_sum", model="llama") >= TTFT_MS / 1000
        assert (metric(text, "llmgw_gateway_time_to_first_token_seconds_sum", model="llama")
                < metric(text, "llmgw_gateway_request_duration_seconds_sum", model="llama"))
        assert metric(text, "llmgw_gateway_output_tokens_total", model="llama") == 5
        assert metric(text, "llmgw_gateway_time_per_output_token_seconds_count", model="llama") == 1
        assert metric(text, "llmgw_gateway_time_per_output_token_seconds_sum", model="llama") > 0

        # Without usage: its first token is timed, its tokens are not counted.
        await chat(s, gw.url, max_tokens=5, stream=True)
        text = await scrape(s, gw)
    assert metric(text, "llmgw_gateway_time_to_first_token_seconds_count", model="llama") == 2
    assert metric(text, "llmgw_gateway_output_tokens_total", model="llama") == 5
    assert metric(text, "llmgw_gateway_time_per_output_token_seconds_count", model="llama") == 1


def test_a_usage_chunk_split_across_reads_is_counted_once():
    m = Metrics(lambda: [])
    usage = (b'data: {"choices":[],"usage":{"prompt_tokens":7,"completion_tokens":4,'
             b'"total_tokens":11}}\n\ndata: [DONE]\n\n')
    timer = m.stream("m", 0.0)
    for chunk in (b'data: {"choices":[{"text":"\\"usage\\""}],"usage":null}\n\n', usage[:40], usage[40:]):
        timer.chunk(chunk)
    timer.end()
    assert (m._input_tokens, m._output_tokens) == ({"m": 7}, {"m": 4})
    assert m.usage("m", b'{"choices":[],"usage":null}') is None


def test_a_prediction_is_checked_against_the_cached_tokens_the_engine_reports():
    """precise-prefix's predicted cached tokens against usage.prompt_tokens_details.cached_tokens: agreed
    within one block (16 tokens), the difference in the histogram; a usage without the figure checks nothing."""
    m = Metrics(lambda: [])
    def usage(cached: int) -> bytes:
        return (b'{"usage":{"prompt_tokens":100,"completion_tokens":1,"prompt_tokens_details":{"cached_tokens":%d}}}'
                % cached)
    m.usage("m", usage(64), (64, 16))   # right
    m.usage("m", usage(48), (64, 16))   # one block off: the engine evicted one since
    m.usage("m", usage(96), (64, 16))   # two blocks missed: their events had not arrived
    m.usage("m", b'{"usage":{"prompt_tokens":100,"completion_tokens":1}}', (64, 16))
    m.usage("m", usage(0), None)        # not a precise-prefix request
    text = m.render().decode()
    assert metric(text, "llmgw_gateway_kv_predictions_total", model="m") == 3
    assert metric(text, "llmgw_gateway_kv_predictions_agreed_total", model="m") == 2
    assert metric(text, "llmgw_gateway_kv_predicted_cached_tokens_error_bucket", model="m", le="-32.0") == 1
    assert metric(text, "llmgw_gateway_kv_predicted_cached_tokens_error_bucket", model="m", le="0.0") == 2
    assert metric(text, "llmgw_gateway_kv_predicted_cached_tokens_error_bucket", model="m", le="16.0") == 3
    # a histogram with negative buckets has no _sum or _count (Prometheus' rule): the +Inf bucket counts

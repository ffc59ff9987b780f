"""The gateway's proxy against real sim engines (subprocesses), on real loopback sockets."""
from __future__ import annotations

import json
import os

import aiohttp
import openai
import pytest

from llmgw.dev.process import free_port
from llmgw.gateway.apikeys import ApiKeys
from llmgw.gateway.gateway import QueueSettings
from llmgw.gateway.proxy import REPLICA_HEADER
from llmgw.gateway.table import RoutingTable
from tests.fixtures.gateway import Sim, metric, model, replica, running_gateway, scrape
from tests.fixtures.poll import until

NAMES = ("llama", "small")


@pytest.fixture(scope="module")
def sims():
    """Two engines of model llama (alias small); slow tokens so a stream takes a while."""
    pair = [Sim.start(*NAMES, extra=["--tokens-per-second", "50"]) for _ in range(2)]
    yield pair
    for s in pair:
        s.stop()


def llama_table(*endpoints: str, **replica_kw) -> RoutingTable:
    t = RoutingTable()
    t.apply("models", "ADDED", model("llama", aliases=("small",)))
    for i, ep in enumerate(endpoints):
        t.apply("replicas", "ADDED", replica(f"llama-{i}", "llama", ep, served=NAMES, **replica_kw))
    return t


async def post(session, url, body, headers=None):
    data = body if isinstance(body, (bytes, str)) else json.dumps(body)
    async with session.post(url, data=data, headers=headers or {"Content-Type": "application/json"}) as r:
        return r.status, r.headers, await r.read()


def openai_error(raw: bytes) -> dict:
    doc = json.loads(raw)
    assert set(doc) == {"error"} and set(doc["error"]) == {"message", "type", "param", "code"}, doc
    return doc["error"]


# ------------------------------------------------------------------ the openai client

async def test_openai_client_by_name_and_alias_streaming_and_not(sims):
    async with running_gateway(llama_table(*(s.endpoint for s in sims))) as gw:
        client = openai.AsyncOpenAI(base_url=gw.url + "/v1", api_key="unused", max_retries=0)
        try:
            chat = await client.chat.completions.create(
                model="small", messages=[{"role": "user", "content": "hi"}], max_tokens=3)
            assert chat.model == "small" and chat.choices[0].message.content.strip()
            assert chat.usage.completion_tokens == 3

            comp = await client.completions.create(model="llama", prompt="hi", max_tokens=2)
            assert comp.choices[0].text.strip() and comp.usage.completion_tokens == 2

            stream = await client.chat.completions.create(
                model="llama", messages=[{"role": "user", "content": "hi"}], max_tokens=4, stream=True)
            pieces = [c.choices[0].delta.content async for c in stream if c.choices and c.choices[0].delta.content]
            assert len(pieces) == 4

            stream = await client.completions.create(model="small", prompt="x", max_tokens=3, stream=True)
            texts = [c.choices[0].text async for c in stream]
            assert len([t for t in texts if t]) == 3

            models = await client.models.list()
            assert sorted(m.id for m in models.data) == ["llama", "small"]
            assert (await client.models.retrieve("small")).id == "small"

            with pytest.raises(openai.NotFoundError) as err:
                await client.completions.create(model="gpt-9", prompt="x", max_tokens=1)
            assert err.value.code == "model_not_found"
        finally:
            await client.close()


async def test_sse_is_relayed_as_it_is_generated(sims):
    """The first event reaches the client while the engine is still generating the rest."""
    async with running_gateway(llama_table(sims[0].endpoint)) as gw, aiohttp.ClientSession() as s:
        body = {"model": "llama", "prompt": "x", "max_tokens": 50, "stream": True}  # 1 s at 50 tok/s
        async with s.post(gw.url + "/v1/completions", json=body) as r:
            assert r.headers["Content-Type"].startswith("text/event-stream")
            first = await r.content.readuntil(b"\n\n")
            assert first.startswith(b"data: {")
            # Still outstanding at the gateway: nothing was buffered up to the end.
            text = await scrape(s, gw)
            assert metric(text, "llmgw_gateway_inflight_requests", replica="llama-0") == 1
            rest = await r.read()
        assert rest.rstrip().endswith(b"data: [DONE]") and rest.count(b"data: {") == 49


async def test_least_outstanding_sends_work_away_from_a_busy_replica(sims):
    async with running_gateway(llama_table(*(s.endpoint for s in sims))) as gw, aiohttp.ClientSession() as s:
        slow = {"model": "llama", "prompt": "x", "max_tokens": 50, "stream": True}
        async with s.post(gw.url + "/v1/completions", json=slow) as held:
            busy = held.headers[REPLICA_HEADER]
            await held.content.readuntil(b"\n\n")
            served = []
            for _ in range(4):
                status, headers, _ = await post(s, gw.url + "/v1/completions",
                                                {"model": "small", "prompt": "x", "max_tokens": 1})
                assert status == 200
                served.append(headers[REPLICA_HEADER])
            await held.read()
        assert busy not in served and len(set(served)) == 1


async def test_a_replica_marked_for_deletion_gets_no_new_requests(sims):
    t = llama_table(*(s.endpoint for s in sims))
    async with running_gateway(t) as gw, aiohttp.ClientSession() as s:
        t.apply("replicas", "MODIFIED", replica("llama-0", "llama", sims[0].endpoint, served=NAMES, deleting=True))
        for _ in range(4):
            status, headers, _ = await post(s, gw.url + "/v1/completions", {"model": "llama", "prompt": "x"})
            assert (status, headers[REPLICA_HEADER]) == (200, "llama-1")


# ------------------------------------------------------------------ engine failures

async def test_an_engine_that_dies_on_the_request_is_retried_on_another_replica(sims):
    doomed = [Sim.start(*NAMES, extra=["--crash-on-request", "1"], wait=False) for _ in range(2)]
    try:
        for stream, engine in zip((False, True), doomed, strict=False):
            engine.wait_ready()
            # "llama-0" sorts first, so the round robin tries the doomed engine first.
            async with running_gateway(llama_table(engine.endpoint, sims[1].endpoint)) as gw, \
                    aiohttp.ClientSession() as s:
                status, headers, body = await post(
                    s, gw.url + "/v1/chat/completions",
                    {"model": "llama", "messages": [{"role": "user", "content": "x"}], "max_tokens": 2,
                     "stream": stream})
                assert status == 200, body
                assert headers[REPLICA_HEADER] == "llama-1"
                if stream:
                    assert body.rstrip().endswith(b"data: [DONE]")
                text = await scrape(s, gw)
            assert engine.proc.wait(10) != 0
            assert metric(text, "llmgw_gateway_upstream_errors_total", replica="llama-0") == 1
            assert metric(text, "llmgw_gateway_retries_total", model="llama") == 1
            assert metric(text, "llmgw_gateway_requests_total", model="llama", code="200") == 1
    finally:
        for engine in doomed:
            engine.kill()


async def test_a_killed_engine_with_pooled_connections_is_retried_elsewhere(sims):
    victim = Sim.start(*NAMES)
    try:
        async with running_gateway(llama_table(victim.endpoint, sims[1].endpoint)) as gw, \
                aiohttp.ClientSession() as s:
            seen = set()
            for _ in range(4):  # open keep-alive connections to both
                status, headers, _ = await post(s, gw.url + "/v1/completions", {"model": "llama", "prompt": "x"})
                seen.add(headers[REPLICA_HEADER])
            assert seen == {"llama-0", "llama-1"}
            victim.kill()
            for _ in range(4):
                status, headers, body = await post(s, gw.url + "/v1/completions", {"model": "llama", "prompt": "x"})
                assert (status, headers[REPLICA_HEADER]) == (200, "llama-1"), body
    finally:
        victim.kill()


async def test_no_live_engine_is_a_502_and_no_ready_replica_a_503():
    dead = f"127.0.0.1:{free_port()}"  # nothing listens there
    t = llama_table(dead)
    t.apply("models", "ADDED", model("idle"))
    # idle's request waits for a replica (scale from zero) for the queue's timeout, then is the 503:
    # 1 s here rather than the default 60
    async with running_gateway(t, retry_after=7, queue=QueueSettings(timeout=1.0)) as gw, \
            aiohttp.ClientSession() as s:
        status, _, body = await post(s, gw.url + "/v1/completions", {"model": "small", "prompt": "x"})
        assert status == 502
        err = openai_error(body)
        assert err["type"] == "upstream_error" and dead in err["message"]

        status, headers, body = await post(s, gw.url + "/v1/completions", {"model": "idle", "prompt": "x"})
        assert status == 503 and headers["Retry-After"] == "7"
        assert "idle" in openai_error(body)["message"]

        text = await scrape(s, gw)
        assert metric(text, "llmgw_gateway_upstream_errors_total", replica="llama-0") == 2
        assert metric(text, "llmgw_gateway_requests_total", model="idle", code="503") == 1
        async with s.get(gw.url + "/v1/models") as r:
            listed = [m["id"] for m in (await r.json())["data"]]
        assert listed == ["llama", "small"]  # idle has no replica: not routable, not listed


# ------------------------------------------------------------------ request errors

async def test_request_errors_in_openai_format():
    t = llama_table("127.0.0.1:9")
    t.apply("models", "ADDED", model("mistral", aliases=("tiny",)))
    async with running_gateway(t, max_body_bytes=1000) as gw, aiohttp.ClientSession() as s:
        url = gw.url + "/v1/chat/completions"
        status, _, body = await post(s, url, {"model": "gpt-4", "messages": []})
        assert status == 404
        assert openai_error(body) == {
            "message": "The model 'gpt-4' does not exist; known models: llama, mistral, small, tiny",
            "type": "invalid_request_error", "param": "model", "code": "model_not_found"}

        status, _, body = await post(s, url, b'{"model": "llama", ')
        assert status == 400 and openai_error(body)["type"] == "invalid_request_error"
        status, _, body = await post(s, url, b'["llama"]')
        assert status == 400 and "JSON object" in openai_error(body)["message"]
        for doc in ({"messages": []}, {"model": 3}, {"model": ""}):
            status, _, body = await post(s, url, doc)
            assert status == 400 and openai_error(body)["param"] == "model", doc

        big = {"model": "llama", "prompt": "x" * 1000}
        status, _, body = await post(s, url, big)
        assert status == 413 and openai_error(body)["code"] == "request_too_large"

        async def chunked():  # no Content-Length: the limit holds while reading
            for _ in range(5):
                yield b" " * 400
        async with s.post(url, data=chunked()) as r:
            assert r.status == 413
            openai_error(await r.read())

        text = await scrape(s, gw)
        assert metric(text, "llmgw_gateway_requests_total", model="-", code="404") == 1
        assert metric(text, "llmgw_gateway_requests_total", model="-", code="400") == 5
        assert metric(text, "llmgw_gateway_requests_total", model="-", code="413") == 2
        assert metric(text, "llmgw_gateway_request_duration_seconds_count", model="-") == 8


async def test_api_keys_are_required_and_reread_when_the_file_changes(sims, tmp_path):
    keys = tmp_path / "keys"
    keys.write_text("# team a\nkey-one\n\n")
    async with running_gateway(llama_table(sims[0].endpoint), authenticator=ApiKeys(str(keys))) as gw, \
            aiohttp.ClientSession() as s:
        url = gw.url + "/v1/completions"
        body = {"model": "llama", "prompt": "x", "max_tokens": 1}

        def auth(key):
            return {"Content-Type": "application/json", "Authorization": f"Bearer {key}"}

        status, headers, raw = await post(s, url, body)
        assert status == 401 and openai_error(raw)["code"] == "invalid_api_key"
        assert headers["WWW-Authenticate"].startswith("Bearer")
        assert (await post(s, url, body, auth("key-two")))[0] == 401
        assert (await post(s, url, body, {"Authorization": "Basic a2V5LW9uZQ=="}))[0] == 401
        assert (await post(s, url, body, auth("key-one")))[0] == 200
        async with s.get(gw.url + "/v1/models") as r:
            assert r.status == 401
        async with s.get(gw.url + "/healthz") as r:
            assert r.status == 200  # probes need no key

        keys.write_text("key-two\n")
        os.utime(keys, ns=(0, 1))  # a new mtime even on a coarse-grained filesystem clock
        assert (await post(s, url, body, auth("key-two")))[0] == 200
        assert (await post(s, url, body, auth("key-one")))[0] == 401

        keys.unlink()  # an unreadable file keeps the keys last loaded
        assert (await post(s, url, body, auth("key-two")))[0] == 200


async def test_client_leaving_mid_stream_releases_the_replica(sims):
    async with running_gateway(llama_table(sims[0].endpoint)) as gw:
        async with aiohttp.ClientSession() as s:
            r = await s.post(gw.url + "/v1/completions",
                             json={"model": "llama", "prompt": "x", "max_tokens": 200, "stream": True})
            await r.content.readuntil(b"\n\n")
            r.close()  # drop the connection mid-stream
        await until(lambda: gw.gateway.balancer.inflight == {}, "the replica released")


async def test_an_engine_stopped_with_requests_in_flight_fails_none(sims):
    """SIGTERM while a stream runs on it: the stream finishes, new requests go elsewhere.

    The gateway still lists the stopping replica (the worst case: its removal not yet
    seen) and, having the fewest outstanding requests, tries it first: those requests
    must be retried on the other replica.
    """
    stopping = Sim.start(*NAMES, extra=["--tokens-per-second", "50"])
    table = llama_table(sims[1].endpoint)  # llama-0 = sims[1] for now
    slow = {"model": "llama", "prompt": "x", "max_tokens": 150, "stream": True}  # 3 s each
    try:
        async with running_gateway(table) as gw, aiohttp.ClientSession() as s:
            busy = [await s.post(gw.url + "/v1/completions", json=slow) for _ in range(2)]
            table.apply("replicas", "ADDED", replica("stopping", "llama", stopping.endpoint, served=NAMES))
            held = await s.post(gw.url + "/v1/completions", json=slow)
            assert held.headers[REPLICA_HEADER] == "stopping"
            for r in (*busy, held):
                await r.content.readuntil(b"\n\n")
            stopping.proc.terminate()
            results = [await post(s, gw.url + "/v1/completions", {"model": "llama", "prompt": "x"})
                       for _ in range(4)]
            assert [(st, h[REPLICA_HEADER]) for st, h, _ in results] == [(200, "llama-0")] * 4
            for r in (*busy, held):
                rest = await r.read()
                assert rest.rstrip().endswith(b"data: [DONE]") and rest.count(b"data: {") == 149
            text = await scrape(s, gw)
        assert metric(text, "llmgw_gateway_upstream_errors_total", replica="stopping") >= 1
        assert metric(text, "llmgw_gateway_requests_total", code="200") == 7
        assert stopping.proc.wait(10) == 0
    finally:
        stopping.kill()

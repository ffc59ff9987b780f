"""The rest of the OpenAI-compatible surface through a real gateway to real sim engines: the
Responses API (the official `openai` client, streamed and not) with a follow-up reaching the
replica that holds its previous response through any gateway, audio uploads (the official
client, a multipart form whose model is read and rewritten; a 413 before an oversized one is
read whole), /tokenize, /detokenize, /rerank, /pooling and /classify routed by model, and a 404
for an endpoint the model's engine does not serve."""
from __future__ import annotations

import asyncio

import aiohttp
import pytest
from openai import AsyncOpenAI, NotFoundError

from llmgw.gateway.gateway import QueueSettings
from llmgw.gateway.proxy import REPLICA_HEADER
from llmgw.gateway.table import RoutingTable
from tests.fixtures.gateway import Sim, metric, model, replica, running_gateway, running_sims, scrape


@pytest.fixture(scope="module")
def sims():
    # a first token after 200 ms: requests sent together overlap, so the balancer spreads them
    with running_sims(3, "m", extra=["--ttft-ms", "200"]) as started:
        yield started


def table_of(sims: list[Sim]) -> RoutingTable:
    table = RoutingTable()
    table.apply("models", "ADDED", model("m", aliases=("mm",)))
    table.apply("models", "ADDED", model("l"))
    for i, sim in enumerate(sims):   # the engine answers to "m" alone: "mm" is rewritten for it
        table.apply("replicas", "ADDED", replica(f"r{i}", "m", sim.endpoint, served=("m",)))
    # a llama-server replica (a sim behind it: the gateway must not reach it for what llama-server lacks)
    table.apply("replicas", "ADDED", replica("l0", "l", sims[0].endpoint, served=("m",), engine="llamacpp"))
    return table


async def create(client: AsyncOpenAI, **kw) -> tuple[str, str]:
    """(response id, the replica that answered) of a Responses API call."""
    raw = await client.responses.with_raw_response.create(model="m", max_output_tokens=3, **kw)
    return raw.parse().id, raw.headers[REPLICA_HEADER]


def client_of(gw) -> AsyncOpenAI:
    return AsyncOpenAI(base_url=gw.url + "/v1", api_key="none", max_retries=0)


async def test_a_follow_up_reaches_the_replica_holding_its_previous_response_through_any_gateway(sims):
    async with running_gateway(table_of(sims)) as a, running_gateway(table_of(sims)) as b:
        ca, cb = client_of(a), client_of(b)
        firsts = await asyncio.gather(*(create(ca, input=f"question {i}") for i in range(6)))
        assert {r for _, r in firsts} == {"r0", "r1", "r2"}   # every replica holds some: the test can fail

        async def follow(response_id: str, home: str, client: AsyncOpenAI) -> None:
            # anywhere else the engine would answer 404 (it does not hold the response)
            follow_up, where = await create(client, input="and then?", previous_response_id=response_id)
            assert where == home
            retrieved = await client.responses.with_raw_response.retrieve(response_id)
            assert retrieved.headers[REPLICA_HEADER] == home and retrieved.parse().id == response_id
            again = await client.responses.with_raw_response.create(
                model="m", max_output_tokens=3, input="and?", previous_response_id=follow_up)
            assert again.headers[REPLICA_HEADER] == home
            assert again.parse().previous_response_id == follow_up   # as the client knows it

        # a gateway started after the responses were made (as one restarted) knows where they are too
        async with running_gateway(table_of(sims)) as c:
            cc = client_of(c)
            await asyncio.gather(*(follow(response_id, home, client)
                                   for (response_id, home), client in zip(firsts, (ca, cb, cc, cb, cc, ca),
                                                                           strict=True)))
        async with aiohttp.ClientSession() as s:
            made = [metric(await scrape(s, gw), "llmgw_gateway_output_tokens_total", model="m") for gw in (a, b)]
        # usage read from each response made where it was made (not from those retrieved): 3 tokens out each
        assert made == [3 * (6 + 2 * 2), 3 * 2 * 2]
        with pytest.raises(NotFoundError, match="no llmgw gateway made this id"):   # nobody knows where: no guess
            await ca.responses.retrieve("resp_not_made_here")


async def test_a_stream_is_relayed_event_by_event_and_its_follow_up_stays(sims):
    async with running_gateway(table_of(sims)) as gw:
        client = client_of(gw)
        raw = await client.responses.with_raw_response.create(model="m", input="hello there", max_output_tokens=3,
                                                              stream=True)
        home = raw.headers[REPLICA_HEADER]
        events = [event async for event in raw.parse()]
        kinds = [e.type for e in events]
        assert kinds[0] == "response.created" and kinds[-1] == "response.completed"
        assert kinds.count("response.output_text.delta") == 3
        completed = events[-1].response
        assert completed.usage is not None and completed.usage.output_tokens == 3
        for _ in range(3):
            _, where = await create(client, input="more", previous_response_id=completed.id)
            assert where == home
        async with aiohttp.ClientSession() as s:
            text = await scrape(s, gw)
        assert metric(text, "llmgw_gateway_input_tokens_total", model="m") == 2 + 3 * 1


async def test_a_drained_replicas_stream_ends_whole_and_a_follow_up_is_a_clear_404(sims):
    table = table_of(sims)
    async with running_gateway(table) as gw:
        client = client_of(gw)
        raw = await client.responses.with_raw_response.create(model="m", input="remember this", max_output_tokens=3,
                                                              stream=True)
        home = raw.headers[REPLICA_HEADER]
        # its replica is marked for deletion mid-stream (drained): the stream still ends whole
        table.apply("replicas", "MODIFIED", replica(home, "m", sims[int(home[1:])].endpoint, deleting=True))
        events = [event async for event in raw.parse()]
        assert events[-1].type == "response.completed"
        with pytest.raises(NotFoundError) as caught:
            await create(client, input="and?", previous_response_id=events[-1].response.id)
        error = caught.value.body
        assert isinstance(error, dict) and error["code"] == "response_replica_gone"
        assert events[-1].response.id in error["message"] and home in error["message"]
        assert error["param"] == "previous_response_id"
        with pytest.raises(NotFoundError, match="has left routing"):
            await client.responses.retrieve(events[-1].response.id)


async def test_tokenize_detokenize_and_rerank_are_routed_by_model(sims):
    async with running_gateway(table_of(sims)) as gw, aiohttp.ClientSession() as s:
        async with s.post(gw.url + "/tokenize", json={"model": "m", "prompt": "one two three"}) as r:
            assert r.status == 200 and r.headers[REPLICA_HEADER] in ("r0", "r1")
            tokenized = await r.json()
        assert tokenized["count"] == 3
        async with s.post(gw.url + "/detokenize", json={"model": "m", "tokens": [0, 1]}) as r:
            assert r.status == 200 and (await r.json())["prompt"] == " lorem ipsum"
        async with s.post(gw.url + "/v1/rerank", json={"model": "m", "query": "red fox",
                                                       "documents": ["a blue bird", "the red fox"]}) as r:
            assert r.status == 200
            assert [x["index"] for x in (await r.json())["results"]] == [1, 0]
        # each model lists what its engine serves
        async with s.get(gw.url + "/v1/models") as r:
            cards = {card["id"]: card["endpoints"] for card in (await r.json())["data"]}
        assert "/v1/responses" in cards["m"] and "/v1/embeddings" not in cards["m"]
        assert "/v1/responses" not in cards["l"] and "/v1/reranking" in cards["l"]
        # an unknown model is the model's 404, on these endpoints too
        async with s.post(gw.url + "/tokenize", json={"model": "nope", "prompt": "x"}) as r:
            assert r.status == 404 and (await r.json())["error"]["code"] == "model_not_found"


async def test_an_audio_upload_is_routed_by_its_forms_model(sims):
    async with running_gateway(table_of(sims)) as gw:
        clip = bytes(range(256)) * 40 + b"\r\n--not-the-boundary\r\n"
        # "mm" is an alias: the engine gets "m" in the form, the file untouched
        made = await client_of(gw).audio.transcriptions.with_raw_response.create(
            model="mm", file=("clip.wav", clip, "audio/wav"), language="en")
        assert made.headers[REPLICA_HEADER] in ("r0", "r1", "r2")
        assert made.parse().text == f"{len(clip)} bytes of clip.wav"
        async with aiohttp.ClientSession() as s:
            form = aiohttp.FormData({"model": "m", "response_format": "text"})
            form.add_field("file", b"ID3", filename="b.mp3")
            async with s.post(gw.url + "/v1/audio/translations", data=form) as r:
                assert r.status == 200 and await r.text() == "3 bytes of b.mp3"
            no_model = aiohttp.FormData()
            no_model.add_field("file", b"RIFF", filename="a.wav")
            async with s.post(gw.url + "/v1/audio/transcriptions", data=no_model) as r:
                assert r.status == 400 and (await r.json())["error"]["param"] == "model"
            async with s.post(gw.url + "/v1/audio/transcriptions", json={"model": "m"}) as r:
                assert r.status == 400 and "multipart/form-data" in (await r.json())["error"]["message"]


async def test_an_oversized_upload_is_a_413_before_it_is_read_whole(sims):
    async with running_gateway(table_of(sims), max_body_bytes=64 * 1024) as gw:
        reader, writer = await asyncio.open_connection("127.0.0.1", int(gw.url.rsplit(":", 1)[1]))
        head = (b"POST /v1/audio/transcriptions HTTP/1.1\r\nHost: x\r\n"
                b"Content-Type: multipart/form-data; boundary=b\r\nContent-Length: %d\r\n\r\n" % (100 << 20))
        # the form's first bytes only: the other 100 MiB are never sent, and the answer comes
        writer.write(head + b'--b\r\nContent-Disposition: form-data; name="model"\r\n\r\nm\r\n')
        await writer.drain()
        status_line = await asyncio.wait_for(reader.readline(), 10)
        writer.close()
    assert status_line.startswith(b"HTTP/1.1 413")


async def test_pooling_and_classify_are_routed_by_model(sims):
    async with running_gateway(table_of(sims)) as gw, aiohttp.ClientSession() as s:
        async with s.post(gw.url + "/pooling", json={"model": "mm", "input": ["one two", "three"]}) as r:
            assert r.status == 200 and [d["data"][0] for d in (await r.json())["data"]] == [2.0, 1.0]
        async with s.post(gw.url + "/classify", json={"model": "m", "input": "one two three"}) as r:
            assert r.status == 200 and (await r.json())["data"][0]["label"] == "LABEL_1"
        async with s.post(gw.url + "/classify", json={"model": "l", "input": "x"}) as r:
            assert r.status == 404 and (await r.json())["error"]["code"] == "endpoint_not_served"


async def test_tokenize_waits_in_no_queue():
    table = RoutingTable()
    table.apply("models", "ADDED", model("z"))   # no replica yet: a generation would wait for one
    async with running_gateway(table, queue=QueueSettings(timeout=5)) as gw, aiohttp.ClientSession() as s:
        async with s.post(gw.url + "/tokenize", json={"model": "z", "prompt": "x"}) as r:
            assert r.status == 503 and (await r.json())["error"]["code"] == "no_ready_replica"


@pytest.mark.parametrize(("name", "path"), [("l", "/v1/responses"), ("l", "/v1/score"), ("m", "/v1/score"),
                                            ("m", "/v2/rerank")])
async def test_an_endpoint_the_models_engine_does_not_serve_is_a_404_naming_both(sims, name, path):
    async with running_gateway(table_of(sims)) as gw, aiohttp.ClientSession() as s:
        async with s.post(gw.url + path, json={"model": name, "input": "x", "text_1": "a", "text_2": "b"}) as r:
            assert r.status == 404 and REPLICA_HEADER not in r.headers
            error = (await r.json())["error"]
    assert error["code"] == "endpoint_not_served"
    assert path in error["message"] and ("llamacpp" if name == "l" else "sim") in error["message"]

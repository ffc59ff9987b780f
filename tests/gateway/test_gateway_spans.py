"""OpenTelemetry spans of the gateway's requests (`--otel`), through a real gateway and sim engine.

The span is the request's traceparent's: the client's trace, the client's span as its
parent; exported by OpenTelemetry's SDK, in memory and over OTLP/HTTP to a receiver.
"""
from __future__ import annotations

import asyncio

import aiohttp
from aiohttp import web
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from llmgw.dev.process import free_port
from llmgw.gateway.spans import Spans
from tests.fixtures.gateway import running_gateway
from tests.gateway.test_gateway_server import sim, table_for  # noqa: F401 - the module's sim engine fixture

CLIENT_TRACE, CLIENT_SPAN = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
CLIENT = f"00-{CLIENT_TRACE}-{CLIENT_SPAN}-01"


async def ask(url: str, model: str = "llama", headers: dict[str, str] | None = None) -> int:
    body = {"model": model, "prompt": "hi", "max_tokens": 2}
    async with aiohttp.ClientSession() as s, s.post(url + "/v1/completions", json=body, headers=headers) as r:
        await r.read()
        return r.status


async def test_a_request_is_a_span_of_the_clients_trace_with_genai_attributes(sim):
    exporter = InMemorySpanExporter()
    async with running_gateway(table_for(sim.endpoint), spans=Spans(SimpleSpanProcessor(exporter))) as gw:
        assert await ask(gw.url, headers={"traceparent": CLIENT}) == 200
        assert await ask(gw.url) == 200                    # a trace of its own
        assert await ask(gw.url, model="gpt-9") == 404     # never routed: no span
    continued, started = exporter.get_finished_spans()
    assert continued.name == "text_completion llama" and continued.kind is SpanKind.SERVER
    assert f"{continued.context.trace_id:032x}" == CLIENT_TRACE
    assert continued.parent is not None and f"{continued.parent.span_id:016x}" == CLIENT_SPAN
    assert continued.context.span_id != int(CLIENT_SPAN, 16)
    assert dict(continued.attributes or {}) == {
        "gen_ai.operation.name": "text_completion", "gen_ai.request.model": "llama",
        "http.response.status_code": 200, "url.path": "/v1/completions"}
    assert continued.status.status_code is StatusCode.UNSET and continued.end_time > continued.start_time
    assert started.parent is None and started.context.trace_id != continued.context.trace_id
    assert continued.resource.attributes["service.name"] == "llmgw-gateway"


async def test_spans_go_over_otlp_http_where_the_standard_variables_say(sim, monkeypatch):
    received: list[ExportTraceServiceRequest] = []

    async def traces(request: web.Request) -> web.Response:
        received.append(ExportTraceServiceRequest.FromString(await request.read()))
        return web.Response(content_type="application/x-protobuf", body=b"")
    app = web.Application()
    app.router.add_post("/v1/traces", traces)
    runner = web.AppRunner(app)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", f"http://127.0.0.1:{port}")
    monkeypatch.setenv("OTEL_SERVICE_NAME", "gw-under-test")
    try:
        spans = Spans.otlp()
        async with running_gateway(table_for(sim.endpoint), spans=spans) as gw:
            assert await ask(gw.url, headers={"traceparent": CLIENT}) == 200
            await asyncio.to_thread(spans.shutdown)   # the batch is exported; the receiver runs on this loop
    finally:
        await runner.cleanup()
    [export] = received
    [resource_spans] = export.resource_spans
    service = {a.key: a.value.string_value for a in resource_spans.resource.attributes}["service.name"]
    [span] = [s for scope in resource_spans.scope_spans for s in scope.spans]
    assert service == "gw-under-test" and span.name == "text_completion llama"
    assert span.trace_id.hex() == CLIENT_TRACE and span.parent_span_id.hex() == CLIENT_SPAN

"""OpenTelemetry spans of the gateway's requests: optional (`pip install 'llmgw[otel]'`,
`llmgw gateway --otel`).

One span per proxied request, exported over OTLP/HTTP where OpenTelemetry's standard
variables say (llmgw/otel.py; the service is "llmgw-gateway" unless OTEL_SERVICE_NAME
names it), in batches from the SDK's own thread, off the event loop. The span is the
one the request's traceparent names (trace.py): its trace id and span id are the ones
the engine gets as its parent, so an engine's own spans (vLLM with OpenTelemetry) hang
under it; its parent is the client's span when the request came with a traceparent.
Its name and attributes follow OpenTelemetry's GenAI semantic conventions where they
fit: "{gen_ai.operation.name} {gen_ai.request.model}", with http.response.status_code,
and error.type on a 5xx.

The SDK's tracer is not used: it would make span ids of its own, and the span must be
the one already sent to the engine. A finished span is built whole and handed to the
batch processor (a few microseconds, only with --otel).
"""
from __future__ import annotations

import time
from typing import TYPE_CHECKING

from llmgw.gateway import trace

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import SpanProcessor

SERVICE = "llmgw-gateway"
# The proxied paths as GenAI operations.
OPERATIONS = {b"/v1/chat/completions": "chat", b"/v1/completions": "text_completion", b"/v1/embeddings": "embeddings"}


class Spans:
    def __init__(self, processor: "SpanProcessor") -> None:
        from opentelemetry.sdk.util.instrumentation import InstrumentationScope

        from llmgw import otel

        self.processor = processor
        self.resource = otel.resource(SERVICE)
        self.scope = InstrumentationScope("llmgw.gateway")

    @classmethod
    def otlp(cls) -> "Spans":
        """Exported over OTLP/HTTP, configured by the standard OTEL_* variables (llmgw/otel.py)."""
        from llmgw import otel

        return cls(otel.otlp_processor())

    def request(self, path: bytes, traceparent: bytes | None, incoming: bytes | None, model: str, code: int,
                seconds: float) -> None:
        """A request answered `code` after `seconds`; `traceparent`: the one sent to the engine (None if
        none was: it was answered before routing), `incoming`: the client's."""
        from opentelemetry.sdk.trace import ReadableSpan
        from opentelemetry.trace import SpanContext, SpanKind, Status, StatusCode, TraceFlags

        own = trace.ids(traceparent) if traceparent else None
        if own is None:
            return   # refused before a model was routed: no trace to join
        parent = trace.ids(incoming) if incoming else None
        operation = OPERATIONS.get(path, path.decode("latin-1"))
        attributes: dict[str, str | int] = {
            "gen_ai.operation.name": operation, "gen_ai.request.model": model, "http.response.status_code": code,
            "url.path": path.decode("latin-1")}
        if code >= 500:
            attributes["error.type"] = str(code)
        end = time.time_ns()
        flags = TraceFlags(own[2])
        span = ReadableSpan(
            f"{operation} {model}", context=SpanContext(own[0], own[1], False, flags),
            parent=SpanContext(parent[0], parent[1], True, TraceFlags(parent[2])) if parent else None,
            resource=self.resource, attributes=attributes, kind=SpanKind.SERVER,
            status=Status(StatusCode.ERROR) if code >= 500 else Status(StatusCode.UNSET),
            start_time=end - int(seconds * 1e9), end_time=end, instrumentation_scope=self.scope)
        if flags.sampled:
            self.processor.on_end(span)

    def shutdown(self) -> None:
        """Export what is batched, then stop."""
        self.processor.shutdown()

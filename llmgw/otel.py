"""OpenTelemetry's export, for the components that export spans (the optional `otel` extra).

Spans go over OTLP/HTTP where OpenTelemetry's standard variables say
(OTEL_EXPORTER_OTLP_TRACES_ENDPOINT or OTEL_EXPORTER_OTLP_ENDPOINT, default
http://localhost:4318), in batches from the SDK's own thread; OTEL_SERVICE_NAME names
the service, else the component does. Imported only by a component started with --otel.
"""
from __future__ import annotations

import os

try:
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import SpanProcessor
    from opentelemetry.sdk.trace.export import BatchSpanProcessor
except ImportError as err:   # the extra is not installed
    raise ImportError(f"--otel needs OpenTelemetry's SDK: pip install 'llmgw[otel]' ({err})") from None


def resource(service: str) -> Resource:
    return Resource.create({"service.name": os.environ.get("OTEL_SERVICE_NAME", service)})


def otlp_processor() -> SpanProcessor:
    """Finished spans batched and exported over OTLP/HTTP."""
    return BatchSpanProcessor(OTLPSpanExporter())

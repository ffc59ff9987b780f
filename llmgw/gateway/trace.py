"""W3C Trace Context at the gateway: every request carries a `traceparent` to its engine.

A request that comes with a valid `traceparent` continues that trace: the engine gets
the same trace id, with the gateway's own span as its parent. One without (or with a
malformed one) starts a trace. Engines that speak Trace Context (vLLM with
OpenTelemetry, the sim) join it, so a trace id in a client's, the gateway's and an
engine's logs is one request.
"""
from __future__ import annotations

import os
import re

_TRACEPARENT = re.compile(rb"^00-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})$")
_ZERO_TRACE = b"0" * 32
HEADER = b"traceparent"


def traceparent(incoming: bytes | None) -> bytes:
    """The traceparent the gateway sends on: the incoming trace continued, or a new one (sampled)."""
    m = _TRACEPARENT.match(incoming.strip().lower()) if incoming else None
    span = os.urandom(8).hex().encode()
    if m is not None and m.group(1) != _ZERO_TRACE and m.group(2) != b"0" * 16:
        return b"00-" + m.group(1) + b"-" + span + b"-" + m.group(3)
    return b"00-" + os.urandom(16).hex().encode() + b"-" + span + b"-01"


def trace_id(value: bytes | str) -> str | None:
    """The trace id of a traceparent (or traceresponse) header, if it is one."""
    raw = value.encode() if isinstance(value, str) else value
    m = _TRACEPARENT.match(raw.strip().lower())
    return m.group(1).decode() if m else None


def ids(value: bytes) -> tuple[int, int, int] | None:
    """(trace id, span id, flags) of a traceparent, as integers (OpenTelemetry's SpanContext's)."""
    m = _TRACEPARENT.match(value.strip().lower())
    if m is None:
        return None
    return int(m.group(1), 16), int(m.group(2), 16), int(m.group(3), 16)

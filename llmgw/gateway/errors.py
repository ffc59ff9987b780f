"""Error responses in OpenAI's format: {"error": {"message", "type", "param", "code"}}."""
from __future__ import annotations

import json

from llmgw.gateway.queue import Refusal, Why
from llmgw.gateway.response import JSON, Response


def error_body(message: str, type_: str, param: str | None = None, code: str | None = None) -> bytes:
    return json.dumps({"error": {"message": message, "type": type_, "param": param, "code": code}}).encode()


def error_response(
    status: int, message: str, type_: str, param: str | None = None, code: str | None = None,
    headers: bytes = b"",
) -> Response:
    return Response(status, JSON + headers, error_body(message, type_, param, code))


def model_not_found(model: str, known: list[str]) -> Response:
    listed = ", ".join(known) if known else "(none)"
    return error_response(
        404, f"The model '{model}' does not exist; known models: {listed}",
        "invalid_request_error", "model", "model_not_found",
    )


def no_replica(model: str, retry_after: int) -> Response:
    return error_response(
        503, f"The model '{model}' has no ready replica; retry in {retry_after} s",
        "service_unavailable", "model", "no_ready_replica",
        headers=b"Retry-After: %d\r\n" % retry_after,
    )


_QUEUE_WHY = {
    Why.FULL: ("its wait queue at this gateway is full", "model_queue_full"),
    Why.SHED: ("a request of a higher priority took this one's place in its full wait queue", "request_shed"),
    Why.TIMEOUT: ("this request waited {waited:.0f} s in its queue, the gateway's limit", "model_queue_timeout"),
    Why.LEFT: ("the client hung up while this request waited", "client_closed_request"),
}


def queue_refused(model: str, refusal: Refusal, retry_after: int) -> Response:
    """429 when the model's concurrency limit held the request back, 503 when it had no replica; 499
    (nginx's "client closed request", what the metrics count) to a client that hung up while waiting."""
    why, code = _QUEUE_WHY[refusal.why]
    what = "is at its concurrency limit" if refusal.limited else "has no ready replica yet"
    return error_response(
        499 if refusal.why is Why.LEFT else 429 if refusal.limited else 503,
        f"The model '{model}' {what} and {why.format(waited=refusal.waited)}; retry in {retry_after} s",
        "rate_limit_error" if refusal.limited else "service_unavailable", "model", code,
        headers=b"Retry-After: %d\r\n" % retry_after,
    )


def syncing(retry_after: int) -> Response:
    return error_response(
        503, f"The gateway has not yet loaded its routing table; retry in {retry_after} s",
        "service_unavailable", None, "gateway_syncing", headers=b"Retry-After: %d\r\n" % retry_after,
    )


def bad_request(message: str, param: str | None = None, code: str | None = None) -> Response:
    return error_response(400, message, "invalid_request_error", param, code)


def too_large(limit: int) -> Response:
    return error_response(
        413, f"The request body is larger than the gateway's limit of {limit} bytes",
        "invalid_request_error", None, "request_too_large",
    )


def headers_too_large(limit: int) -> Response:
    return error_response(
        431, f"The request's line and headers are larger than the gateway's limit of {limit} bytes",
        "invalid_request_error", None, "request_headers_too_large",
    )


def request_timeout(message: str) -> Response:
    return error_response(408, message, "invalid_request_error", None, "request_timeout")


def too_many_connections(cap: int) -> Response:
    return error_response(
        429, f"This address has {cap} connections open to the gateway, its limit; send on those, "
        "or close one first", "rate_limit_error", None, "too_many_connections",
    )


def unauthorized(message: str) -> Response:
    return error_response(
        401, message, "invalid_request_error", None, "invalid_api_key",
        headers=b'WWW-Authenticate: Bearer realm="llmgw"\r\n',
    )


def not_found(path: str) -> Response:
    return error_response(404, f"No route for {path}", "invalid_request_error", None, "not_found")


def method_not_allowed(method: str, allowed: str) -> Response:
    return error_response(405, f"{method} is not allowed here; use {allowed}", "invalid_request_error",
                          None, "method_not_allowed", headers=b"Allow: %s\r\n" % allowed.encode())


def internal_error() -> Response:
    return error_response(500, "The gateway failed on this request; see its log",
                          "internal_error", None, "gateway_error")


def bad_gateway(message: str) -> Response:
    return error_response(502, message, "upstream_error", None, "upstream_unreachable")


def endpoint_not_served(path: str, model: str, engines: list[str]) -> Response:
    return error_response(
        404, f"The model '{model}' does not serve {path}: its engine ({', '.join(engines)}) has no such "
        "endpoint (docs/gateway.md, 'Endpoints')", "invalid_request_error", None, "endpoint_not_served")


def response_gone(response_id: str, replica: str, param: str = "previous_response_id") -> Response:
    """The engine's own answer for a response it does not hold (vLLM's shape), saying why."""
    return error_response(
        404, f"Response with id '{response_id}' not found: replica {replica}, which held it, has left "
        "routing", "invalid_request_error", param, "response_replica_gone")


def response_unknown(response_id: str) -> Response:
    """A stored response whose id no gateway handed out (or the caller may not see)."""
    return error_response(
        404, f"Response with id '{response_id}' not found: no llmgw gateway made this id, so it does not "
        "name the replica holding it (docs/gateway.md, 'The Responses API's state')", "invalid_request_error",
        "response_id", "response_not_found")

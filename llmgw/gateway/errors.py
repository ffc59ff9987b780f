"""Error responses in OpenAI's format: {"error": {"message", "type", "param", "code"}}."""
from __future__ import annotations

import json

from aiohttp import web


def error_body(message: str, type_: str, param: str | None = None, code: str | None = None) -> bytes:
    return json.dumps({"error": {"message": message, "type": type_, "param": param, "code": code}}).encode()


def error_response(
    status: int, message: str, type_: str, param: str | None = None, code: str | None = None,
    headers: dict[str, str] | None = None,
) -> web.Response:
    return web.Response(
        status=status, body=error_body(message, type_, param, code),
        content_type="application/json", headers=headers,
    )


def model_not_found(model: str, known: list[str]) -> web.Response:
    listed = ", ".join(known) if known else "(none)"
    return error_response(
        404, f"The model '{model}' does not exist; known models: {listed}",
        "invalid_request_error", "model", "model_not_found",
    )


def no_replica(model: str, retry_after: int) -> web.Response:
    return error_response(
        503, f"The model '{model}' has no ready replica; retry in {retry_after} s",
        "service_unavailable", "model", "no_ready_replica",
        headers={"Retry-After": str(retry_after)},
    )


def bad_request(message: str, param: str | None = None, code: str | None = None) -> web.Response:
    return error_response(400, message, "invalid_request_error", param, code)


def too_large(limit: int) -> web.Response:
    return error_response(
        413, f"The request body is larger than the gateway's limit of {limit} bytes",
        "invalid_request_error", None, "request_too_large",
    )


def unauthorized(message: str) -> web.Response:
    return error_response(
        401, message, "invalid_request_error", None, "invalid_api_key",
        headers={"WWW-Authenticate": 'Bearer realm="llmgw"'},
    )


def bad_gateway(message: str) -> web.Response:
    return error_response(502, message, "upstream_error", None, "upstream_unreachable")

"""How the API server's handlers read a request and write its answer (docs/contracts.md, "REST").

The steps a handler runs after the URL is authorized (llmgw/server/app.py): `read_body` reads the
body (415 unless the method takes its content-type, 413 over the limit) and parses its JSON (400),
`read_object` decodes and validates it as an object of the URL's kind (400, 422); the handler then
authorizes the object (`Authorize`) and writes it. Every refusal is one of the contract's errors
(llmgw.api.errors), answered by the app's one error middleware.
"""
from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

from aiohttp import web

from llmgw.api import KINDS, AnyObject, ApiKey, InvalidObject, parse_object
from llmgw.api.errors import BadRequest, Invalid, NotFound, RequestEntityTooLarge, UnsupportedMediaType
from llmgw.api.limits import INT64, MAX_BODY_BYTES, InputError, parse_json, too_large
from llmgw.api.meta import check_dns1123_label
from llmgw.api.secrets import REDACTED
from llmgw.server.authz import Action

# The content-types a body may have: an object is JSON; a status PATCH is a JSON merge patch
# (RFC 7386), which the client sends as application/json, so a PATCH takes both.
JSON = "application/json"
BODY_TYPES = {"PATCH": (JSON, "application/merge-patch+json")}

# The authorization step (ApiServer.authorize): raises Forbidden, or lets the request on.
Authorize = Callable[[web.Request, Action], Awaitable[None]]
# Set by the URL's authorization (ApiServer._authorize): the request reads ApiKeys with their secret
# hashes redacted (llmgw/server/authz.py's hides_key_hashes).
HIDE_KEY_HASHES = "hide_key_hashes"


def json_response(data: Any, status: int = 200, headers: dict[str, str] | None = None) -> web.Response:
    return web.Response(text=json.dumps(data), status=status, headers=headers, content_type=JSON)


def dump(obj: AnyObject) -> dict[str, Any]:
    dumped: dict[str, Any] = obj.model_dump(mode="json")
    return dumped


def shown(request: web.Request, obj: AnyObject) -> AnyObject:
    """`obj` as the request's identity reads it: an ApiKey's spec.secretHash REDACTED where HIDE_KEY_HASHES."""
    if request.get(HIDE_KEY_HASHES) and isinstance(obj, ApiKey):
        return obj.model_copy(update={"spec": obj.spec.model_copy(update={"secretHash": REDACTED})})
    return obj


def object_list(kind: str, items: Sequence[AnyObject], revision: int) -> web.Response:
    """A list of objects of `kind` at `revision`, as GET /{kind} answers it."""
    return json_response({"apiVersion": "llmgw.io/v1", "kind": f"{KINDS[kind].model_fields['kind'].default}List",
                          "metadata": {"resourceVersion": revision}, "items": [dump(o) for o in items]})


def watching(request: web.Request) -> bool:
    return request.query.get("watch") in ("1", "true")


def not_a_name(value: str) -> str | None:
    """Why `value` is not an object's name (every kind's names are DNS-1123 labels); None if it is one."""
    try:
        check_dns1123_label(value)
    except ValueError as err:
        return str(err)
    return None


def url_name(field: str, value: str) -> str:
    """A name the URL holds: itself, or a 400 naming the field."""
    why = not_a_name(value)
    if why is not None:
        raise BadRequest(f"{field}: {why}")
    return value


def unknown_kind(kind: object) -> str:
    return f"unknown kind {kind!r} (known: {', '.join(KINDS)})"


def kind_of(request: web.Request) -> str:
    """The URL's kind (plural), or a 404."""
    kind = request.match_info["kind"]
    if kind not in KINDS:
        raise NotFound(unknown_kind(kind))
    return kind


def resource_version(query: Mapping[str, str]) -> int:
    """A watch's ?resourceVersion=: the revision it resumes after (0: none, list first)."""
    asked = query.get("resourceVersion", "")
    try:
        rv = int(asked) if asked else 0
    except ValueError:
        rv = -1
    if not 0 <= rv <= INT64[1]:
        raise BadRequest(f"resourceVersion must be a revision (an integer >= 0), got {asked[:40]!r}")
    return rv


async def read_body(request: web.Request) -> dict[str, Any]:
    """Read the body (415, 413) and parse it as a JSON object (400)."""
    takes = BODY_TYPES.get(request.method, (JSON,))
    if request.content_type not in takes:
        raise UnsupportedMediaType(f"request body: {request.method} takes {' or '.join(takes)}, "
                                   f"not content-type {request.content_type!r}")
    try:
        raw = await request.read()
    except web.HTTPRequestEntityTooLarge:
        raise RequestEntityTooLarge(f"request body: {too_large(MAX_BODY_BYTES)}") from None
    try:
        body = parse_json(raw)  # nesting, duplicate keys and size: llmgw.api.limits
    except InputError as err:
        raise BadRequest(f"request body: {err}") from None
    except UnicodeDecodeError:
        raise BadRequest("request body is not valid JSON (not UTF-8)") from None
    except ValueError as err:
        raise BadRequest(f"request body is not valid JSON: {err}") from None
    if not isinstance(body, dict):
        raise BadRequest("request body must be a JSON object")
    return body


async def read_object(request: web.Request, kind: str, require: str | None = None) -> AnyObject:
    """The body decoded and validated as an object of `kind` (422), named as the URL says (400);
    `require`: a field it must hold."""
    body = await read_body(request)
    if require is not None and require not in body:
        raise Invalid(f"{require}: Field required (this request writes it)")
    try:
        obj = parse_object(body)
    except InvalidObject as err:
        raise Invalid(str(err)) from None
    if obj.kind_plural != kind:
        raise BadRequest(f"body is a {obj.kind}, but the URL says {kind}")
    name = request.match_info.get("name")
    if name is not None and obj.metadata.name != name:
        raise BadRequest(f"body names {obj.metadata.name!r}, but the URL says {name!r}")
    return obj

"""The request's body (read whole, up to the gateway's limit) and the model it names: the JSON
document's `model`, or for the audio endpoints the multipart form's (form.py); a 400, 408 or 413
if it has none."""
from __future__ import annotations

from llmgw.api.limits import parse_json
from llmgw.gateway import errors
from llmgw.gateway.body import Body
from llmgw.gateway.endpoints import MULTIPART
from llmgw.gateway.form import FormError, parse_form
from llmgw.gateway.http1 import BodyError, TimedOut, TooLarge
from llmgw.gateway.response import Response
from llmgw.gateway.step import LATER, Call, Later, Step


class Parse(Step):
    def __init__(self, max_body_bytes: int) -> None:
        self.max_body_bytes = max_body_bytes

    def now(self, call: Call) -> Response | Later | None:
        raw = call.request.body_at_hand()
        return LATER if raw is None else _parse(call, raw)   # None: still arriving, or too large

    async def run(self, call: Call) -> Response | None:
        try:
            raw = await call.request.body()
        except TooLarge:
            return errors.too_large(self.max_body_bytes)
        except TimedOut as err:
            return errors.request_timeout(str(err))
        except BodyError as err:  # cut short, or its chunks malformed
            return errors.bad_request(str(err))
        return _parse(call, raw)


def _parse(call: Call, body: bytes) -> Response | None:
    if call.request.path in MULTIPART:
        return _parse_form(call, body)
    try:
        # '{' then a non-NUL byte is UTF-8 (UTF-16/32 LE put NULs after it, BE and BOMs
        # before): decoding it here skips json's encoding detection, a Python function.
        text = body.decode() if body[:1] == b"{" and body[1:2] != b"\x00" else body
        doc = parse_json(text, unique_keys=False)  # bounded nesting: llmgw.api.limits
    except (ValueError, UnicodeDecodeError) as err:
        return errors.bad_request(
            f"We could not parse the JSON body of your request ({err}); "
            "send a JSON object with 'Content-Type: application/json'")
    if not isinstance(doc, dict):
        return errors.bad_request("The request body must be a JSON object")
    name = doc.get("model")
    if not isinstance(name, str) or not name:
        return errors.bad_request(
            "You must provide a model parameter (a model name or alias; see GET /v1/models)",
            param="model", code="missing_required_parameter")
    call.body, call.name = Body(body, doc), name
    return None


def _parse_form(call: Call, body: bytes) -> Response | None:
    try:
        form = parse_form(body, call.request.header(b"content-type"))
    except FormError as err:
        return errors.bad_request(f"We could not read the model of your upload: {err}", param="model")
    call.body, call.name = form, form.doc["model"]
    return None

"""A multipart/form-data body (the audio endpoints': a file and fields), its `model` field read
with python-multipart's streaming parser.

The body is the one the server holds, read up to the gateway's --max-body-bytes: a larger
upload is a 413 before it is read whole (a Content-Length over the limit at once, a chunk that
would pass it as soon as its size line comes: http1.py). The parser keeps nothing of the
parts but the offsets of the `model` field's value, so that an engine answering to another
name gets the body with that value replaced and nothing else touched (`FormBody.for_backend`).
"""
from __future__ import annotations

import logging

from llmgw.gateway.body import Body
from llmgw.gateway.table import Backend

_MAX_NAME = 1024   # bytes of a model name: more is not a name
# The parser logs a warning for each malformed body: the caller is told (400), the log is not.
_QUIET = logging.getLogger(__name__ + ".parser")
_QUIET.setLevel(logging.CRITICAL)


class FormError(ValueError):
    """Not a multipart form, or one without a model: what to tell the caller."""


class FormBody(Body):
    """A multipart body; its document holds the `model` field alone."""

    __slots__ = ("_at",)

    def __init__(self, raw: bytes, name: str, at: tuple[int, int]) -> None:
        super().__init__(raw, {"model": name})
        self._at = at   # where the model field's value lies in raw

    def for_backend(self, b: Backend, name: str) -> bytes:
        """The form with its model field renamed where the engine serves another name (a form has no
        room for the JSON fields a LoRA request adds: audio is a base model's)."""
        other: str | None = b.upstream_fields(name).get("model")
        if other is None:
            return self.raw
        start, end = self._at
        return self.raw[:start] + other.encode() + self.raw[end:]


def parse_form(raw: bytes, content_type: bytes | None) -> FormBody:
    """The body as a form, its model found; FormError if it is not a form naming one."""
    # imported with the first upload: 35 ms (-X importtime) no gateway pays at its start for nothing
    from python_multipart.exceptions import MultipartParseError
    from python_multipart.multipart import MultipartParser, parse_options_header

    kind, options = parse_options_header(content_type or b"")
    boundary = options.get(b"boundary")
    if kind != b"multipart/form-data" or not boundary:
        raise FormError("send the upload as multipart/form-data (Content-Type with its boundary)")
    header: list[bytes] = [b"", b""]   # the part's current header line: name, value
    in_model = False
    at: list[int] = []   # where the model value's pieces lie in raw: start, end, start, end...
    value = bytearray()

    def on_header_field(data: bytes, start: int, end: int) -> None:
        header[0] += data[start:end]

    def on_header_value(data: bytes, start: int, end: int) -> None:
        header[1] += data[start:end]

    def on_header_end() -> None:
        nonlocal in_model
        name, value = header
        header[:] = [b"", b""]
        if name.lower() == b"content-disposition":
            in_model = parse_options_header(value)[1].get(b"name") == b"model" and not at

    def on_part_data(data: bytes, start: int, end: int) -> None:
        if in_model:
            at.extend((start, end))
            value.extend(data[start:end])   # (a piece the parser held back is not in raw: checked below)

    def on_part_end() -> None:
        nonlocal in_model
        if in_model and not at:
            at.extend((0, 0))   # an empty value: found, and refused below
        in_model = False

    parser = MultipartParser(boundary, {
        "on_header_field": on_header_field, "on_header_value": on_header_value, "on_header_end": on_header_end,
        "on_part_data": on_part_data, "on_part_end": on_part_end})
    parser.logger = _QUIET
    try:
        parser.write(raw)   # one write: offsets are into raw
        parser.finalize()
    except MultipartParseError as err:
        raise FormError(f"the multipart body is malformed: {err}") from None
    if not at:
        raise FormError("the form has no 'model' field")
    start, end = at[0], at[-1]
    if not value or len(value) > _MAX_NAME or raw[start:end] != value:
        raise FormError("the form's 'model' field must be a model name")
    try:
        name = value.decode()
    except UnicodeDecodeError:
        raise FormError("the form's 'model' field must be UTF-8") from None
    return FormBody(raw, name, (start, end))

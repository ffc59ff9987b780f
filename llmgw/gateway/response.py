"""A whole HTTP response, serialised in one piece by the server (http1.py), and how a message goes out.

Header lines are kept as ready-to-send bytes: the proxied hot path copies the
engine's header lines through, and decoding them to str only to encode them
again cost more than the copy.
"""
from __future__ import annotations

import json
import time
from asyncio import WriteTransport
from email.utils import formatdate
from http import HTTPStatus
from typing import Any, final

JSON = b"Content-Type: application/json\r\n"

_REASONS = {s.value: s.phrase.encode() for s in HTTPStatus}


@final
class Response:
    """Status, header lines (b"Name: value\\r\\n" each; no Content-Length) and body."""

    __slots__ = ("status", "headers", "body")

    def __init__(self, status: int, headers: bytes = b"", body: bytes = b""):
        self.status, self.headers, self.body = status, headers, body


def json_response(obj: Any, status: int = 200, headers: bytes = b"") -> Response:
    return Response(status, JSON + headers, json.dumps(obj).encode())


def status_line(status: int) -> bytes:
    return b"HTTP/1.1 %d %s\r\n" % (status, _REASONS.get(status, b"Unknown"))


_ONE_WRITE = 64 * 1024  # head and body joined into one write below this size


def write_message(transport: WriteTransport, head: bytes, body: bytes) -> None:
    """Send an HTTP message: one write (one syscall) for a small body, else two (no big copy)."""
    if len(body) < _ONE_WRITE:
        transport.write(head + body)
    else:
        transport.write(head)
        transport.write(body)


_date_second = 0
_date_line = b""


def date_line() -> bytes:
    """The Date header line, formatted once a second."""
    global _date_second, _date_line
    now = int(time.time())
    if now != _date_second:
        _date_second, _date_line = now, b"Date: " + formatdate(now, usegmt=True).encode() + b"\r\n"
    return _date_line

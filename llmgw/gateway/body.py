"""A proxied request's body: its JSON document, rewritten only where the gateway must."""
from __future__ import annotations

import json
from typing import Any

from llmgw.gateway.table import Backend
from llmgw.routing import RoutingPolicy


class Body:
    """The request body, rewritten only for an engine that does not serve the requested name, or
    names an adapter its own way."""

    __slots__ = ("raw", "doc", "key", "predicted")

    def __init__(self, raw: bytes, doc: dict[str, Any]) -> None:
        self.raw, self.doc = raw, doc
        # (policy, key): the key the model's policy made of this request, once (its type is the policy's)
        self.key: tuple[RoutingPolicy, Any] | None = None
        # (tokens, block size) precise-prefix expects the replica it was sent to to find cached
        self.predicted: tuple[int, int] | None = None

    def update(self, **fields: Any) -> None:
        """Set fields of the document (and the bytes sent with it)."""
        self.doc = {**self.doc, **fields}
        self.raw = json.dumps(self.doc).encode()

    def ask_usage(self) -> None:
        """A stream is to end with its usage (OpenAI's stream_options.include_usage), which the
        gateway counts against a token limit: set for a key with one, even if its client did not."""
        doc = self.doc
        options = doc.get("stream_options")
        if doc.get("stream") is True and not (isinstance(options, dict) and options.get("include_usage") is True):
            self.update(stream_options={**(options if isinstance(options, dict) else {}), "include_usage": True})

    def for_backend(self, b: Backend, name: str) -> bytes:
        fields = b.upstream_fields(name)
        if not fields:
            return self.raw
        return json.dumps({**self.doc, **fields}).encode()

"""The endpoints the gateway routes: every model-addressed endpoint (POST, the model named in
the JSON body, or in the multipart form's `model` field for audio uploads) that an engine
serves, as each engine declares it (`Engine.serves`, llmgw/engines, read from the engine's own
route table); and whether a replica's engine serves one.

A replica of an engine the gateway does not know (a table fed by hand) is taken to serve
the OpenAI endpoints every engine serves."""
from __future__ import annotations

from collections.abc import Iterable

from llmgw.engines import ENGINES
from llmgw.engines.engine import OPENAI
from llmgw.gateway.table import Backend

_DEFAULT = frozenset(path.encode() for path in OPENAI)
_SERVES = {name: frozenset(path.encode() for path in engine.serves) for name, engine in ENGINES.items()}
ROUTED = frozenset().union(_DEFAULT, *_SERVES.values())
EVERYWHERE = _DEFAULT.intersection(*_SERVES.values())   # what no model lacks: not looked up per request
RESPONSES = b"/v1/responses"
# Multipart forms (a file upload), the model in the form's `model` field (form.py).
MULTIPART = frozenset((b"/v1/audio/transcriptions", b"/v1/audio/translations"))
# Cheap: they wait in no queue (answered at once, or 503 when the model has no Ready replica).
UNQUEUED = frozenset((b"/tokenize", b"/detokenize", b"/v1/tokenize", b"/v1/detokenize"))


def endpoints_of(backends: Iterable[Backend]) -> list[str]:
    """The endpoints some of these replicas serve, sorted (a model's, in GET /v1/models)."""
    return sorted(p.decode() for p in frozenset().union(*(_SERVES.get(b.engine, _DEFAULT) for b in backends)))


def serves(b: Backend, path: bytes) -> bool:
    """Whether the engine of replica `b` answers `path`."""
    return path in _SERVES.get(b.engine, _DEFAULT)

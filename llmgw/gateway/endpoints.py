"""The endpoints the gateway routes: every model-addressed JSON endpoint (POST, the model named
in the body) that an engine serves, as each engine declares it (`Engine.serves`, llmgw/engines,
read from the engine's own route table); and whether a replica's engine serves one.

A replica of an engine the gateway does not know (a table fed by hand) is taken to serve
the OpenAI endpoints every engine serves."""
from __future__ import annotations

from llmgw.engines import ENGINES
from llmgw.engines.engine import OPENAI
from llmgw.gateway.table import Backend

ROUTED = frozenset(path.encode() for engine in ENGINES.values() for path in engine.serves) | frozenset(
    path.encode() for path in OPENAI)
RESPONSES = b"/v1/responses"


def serves(b: Backend, path: str) -> bool:
    """Whether the engine of replica `b` answers `path`."""
    engine = ENGINES.get(b.engine)
    return path in (engine.serves if engine is not None else OPENAI)

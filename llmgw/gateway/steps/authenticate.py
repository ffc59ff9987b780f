"""Who calls: the Authorization header, checked by the gateway's Authenticator (auth.py); a 401 if refused."""
from __future__ import annotations

from llmgw.api import ApiKey
from llmgw.gateway import errors
from llmgw.gateway.auth import Authenticator, Caller
from llmgw.gateway.response import Response
from llmgw.gateway.step import LATER, Call, Later, Step


class Authenticate(Step):
    def __init__(self, authenticator: Authenticator) -> None:
        self.authenticator = authenticator

    def now(self, call: Call) -> Response | Later | None:
        caller = self.authenticator.check_now(call.request.header(b"authorization"))
        return LATER if caller is None else _known(call, caller)   # None: a key to verify first

    async def run(self, call: Call) -> Response | None:
        return _known(call, await self.authenticator.check(call.request.header(b"authorization")))


def _known(call: Call, caller: Caller | str) -> Response | None:
    if isinstance(caller, str):
        return errors.unauthorized(caller)
    if isinstance(caller, ApiKey):
        call.key = caller
    return None

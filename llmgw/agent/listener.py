"""The agent's one TLS listener (--logs-listen; its Node's status.agentEndpoint): apps under their
prefixes, each with its own rule of who may ask. /shards/ serves the engine logs to the API server
alone (logs.py); /weights/ serves the weights cache to the other nodes (peers.py); /adapters/ takes
the gateways' direct loads of LoRA adapters (direct.py).

Mutual TLS with the node's own certificate: a client must present a certificate of the cluster's
CA, not revoked (the server's list, which the agent watches: `Revoked`; while the server refuses
that watch, no one: 503), and each app's middleware (`only`) lets one organisation in.
"""
from __future__ import annotations

import logging
import ssl
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from llmgw.pki import normalize_serial

log = logging.getLogger(__name__)

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def _certificate(request: web.Request) -> dict[str, Any]:
    ssl_obj = request.transport.get_extra_info("ssl_object") if request.transport else None
    cert: Any = ssl_obj.getpeercert() if ssl_obj is not None else None
    return cert or {}


def subject(request: web.Request) -> dict[str, str]:
    """The verified client certificate's subject attributes (organizationName, commonName)."""
    return {k: v for rdn in _certificate(request).get("subject", ()) for k, v in rdn}


# the request's: whether its certificate is still not revoked, asked by a long answer
STILL_TRUSTED: web.RequestKey[Callable[[], bool]] = web.RequestKey("still_trusted")


@dataclass
class Revoked:
    """The server's revoked serials, as the agent's watch keeps them, and why the server refuses
    that watch now (`refused`; None: it answers)."""
    serials: set[str] = field(default_factory=set)
    refused: str | None = None


def refuse_revoked(revoked: Revoked) -> Any:
    """A middleware answering 401 to a client certificate whose serial is revoked, and 503 to
    every request while the server refuses the watch of revocations (which are then not known)."""
    @web.middleware
    async def check(request: web.Request, handler: Handler) -> web.StreamResponse:
        if revoked.refused is not None:
            raise web.HTTPServiceUnavailable(text=f"this node's agent cannot tell a revoked certificate: the server "
                                                  f"refuses its watch of revocations ({revoked.refused})")
        serial = normalize_serial(_certificate(request).get("serialNumber", "0"))
        # asked again by an answer that streams for long (a file of a pull in flight): it is cut
        # once the certificate is revoked, or the list can no longer be known
        request[STILL_TRUSTED] = lambda: serial not in revoked.serials and revoked.refused is None
        if serial in revoked.serials:
            who = subject(request)
            log.warning("refused: %s from CN=%s O=%s serial=%s (%s): the certificate is revoked", request.path,
                        who.get("commonName", ""), who.get("organizationName", ""), serial, request.remote)
            raise web.HTTPUnauthorized(text=f"client certificate serial={serial} is revoked")
        return await handler(request)
    return check


def only(org: str, what: str, refusal: Callable[[str, str], str], cn: str | None = None) -> Any:
    """A middleware answering 403, with `refusal(cn, org)`, to every client certificate whose
    organisation is not `org` (or, given `cn`, whose common name is not it); `what` names the
    requests in the log line."""
    @web.middleware
    async def check(request: web.Request, handler: Handler) -> web.StreamResponse:
        who = subject(request)
        theirs, their_cn = who.get("organizationName", ""), who.get("commonName", "")
        if theirs != org or cn is not None and their_cn != cn:
            log.warning("refused: %s %s from CN=%s O=%s (%s): only %sO=%s here", what, request.path, their_cn,
                        theirs, request.remote, f"CN={cn} " if cn is not None else "", org)
            raise web.HTTPForbidden(text=refusal(their_cn, theirs))
        return await handler(request)
    return check


async def serve(apps: dict[str, web.Application], host: str, port: int, tls: ssl.SSLContext,
                revoked: Revoked) -> tuple[web.AppRunner, int]:
    """Listen with `apps` under their prefixes, refusing the certificates `revoked` names, and
    everyone while the server refuses the watch of them (every app's requests); the runner (to
    clean up) and the port bound (port 0: any free one)."""
    root = web.Application(middlewares=[refuse_revoked(revoked)])
    for prefix, app in apps.items():
        root.add_subapp(prefix, app)
    runner = web.AppRunner(root, access_log=None, handle_signals=False)
    await runner.setup()
    await web.TCPSite(runner, host, port, ssl_context=tls).start()
    bound: int = runner.addresses[0][1]
    return runner, bound

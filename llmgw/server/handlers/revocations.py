"""`POST /revocations`: add a certificate's serial to the revoked ones (admins only); nothing in the
API takes one off the list (llmgw/server/revocations.py keeps the set the server checks); the
certificates the server renewed from it (handlers/renewals.py) are revoked with it.
`GET /revocations` lists them (any certificate may, as anyone may read a CA's revocation list;
?watch=1: handlers/watch.py), so the agents' listeners refuse what the server refuses."""
from __future__ import annotations

import logging
from datetime import datetime, timezone

from aiohttp import web

from llmgw.api.errors import BadRequest
from llmgw.pki import CAError, normalize_serial
from llmgw.server.authz import Action
from llmgw.server.request import Authorize, json_response, read_body
from llmgw.store import Store

log = logging.getLogger("llmgw.server")


class Revoke:
    def __init__(self, store: Store, authorize: Authorize) -> None:
        self.store, self.authorize = store, authorize

    async def list(self, request: web.Request) -> web.Response:
        serials, rev = await self.store.revocations.lister_watcher().list()
        return json_response({"kind": "RevocationList", "metadata": {"resourceVersion": rev},
                              "items": [{"serial": s} for s in serials]})

    async def revoke(self, request: web.Request) -> web.Response:
        body = await read_body(request)
        try:
            serial = normalize_serial(str(body["serial"]))
        except KeyError:
            raise BadRequest("field 'serial' is required") from None
        except CAError as err:
            raise BadRequest(f"serial: {err}") from None
        await self.authorize(request, Action("revoke", "revocations", serial))
        info = {"revokedAt": datetime.now(timezone.utc).isoformat(), "revokedBy": request["identity"].name}
        for field in ("role", "name"):   # what the CA's index says the certificate was, when it knows
            value = body.get(field)
            if value is not None:
                if not isinstance(value, str) or len(value) > 253:
                    raise BadRequest(f"{field} must be a string of at most 253 characters")
                info[field] = value
        await self.store.revocations.add(serial, info)
        log.info("certificate serial=%s revoked by %s", serial, request["identity"])
        renewals = await self.store.revocations.descendants(serial)
        for renewal, record in renewals.items():   # what the API renewed of it: the CA's index knows them not
            await self.store.revocations.add(renewal, {**info, "role": record.get("role"), "name": record.get("name"),
                                                       "renewalOf": serial})
            log.info("certificate serial=%s (a renewal of %s) revoked by %s", renewal, serial, request["identity"])
        return json_response({"serial": serial, **info, "renewals": sorted(renewals)}, 201)

"""The gateways' reports: their demand (`POST /demand/<gateway>`, docs/contracts.md, "Autoscaling")
with their API keys' usage and their version, kept under a lease (`DELETE /demand/<gateway>`: a
gateway that stops withdraws them); that usage summed (`GET /usage/apikeys[/<name>]`,
llmgw/api/usage.py); and their versions, with the leading
controller-manager's, and the servers' and controller-managers' announced under their leases
(`GET /versions`); the addresses all of them announce (`GET /members`)."""
from __future__ import annotations

from typing import Any

from aiohttp import web
from pydantic import ValidationError

from llmgw.api import ApiKey
from llmgw.api.demand import DemandReport
from llmgw.api.errors import Invalid, NotFound
from llmgw.api.limits import MAX_TTL
from llmgw.api.manifests import describe_validation_error
from llmgw.api.members import Member
from llmgw.api.usage import KeyUsage, UsageReport, total_usage
from llmgw.server.request import json_response, read_body
from llmgw.store import Store
from llmgw.version import HEADER, version


class Demand:
    def __init__(self, store: Store) -> None:
        self.store = store

    async def report(self, request: web.Request) -> web.Response:
        """A gateway's demand report: kept under its lease."""
        gateway = request.match_info["gateway"]
        body = await read_body(request)
        ttl = body.pop("ttl", 15)
        if not isinstance(ttl, int) or isinstance(ttl, bool) or not 1 <= ttl <= MAX_TTL:
            raise Invalid(f"ttl: must be an integer number of seconds in 1..{MAX_TTL}, got {ttl!r}")
        keys = body.pop("keys", None)   # its API keys' usage, kept beside the demand (llmgw/api/usage.py)
        try:
            report = DemandReport.model_validate({"gateway": gateway, **body, "version": request.headers.get(HEADER)})
            usage = UsageReport.model_validate({"gateway": gateway, "keys": keys}) if keys is not None else None
        except ValidationError as err:
            raise Invalid("; ".join(describe_validation_error(err))) from None
        await self.store.demand.report(report, ttl=ttl, usage=usage)
        # The live gateways, this one included: each enforces its share of an API key's limits.
        return json_response({"gateway": gateway, "ttl": ttl, "gateways": len(await self.store.demand.list())})

    async def withdraw(self, request: web.Request) -> web.Response:
        """A gateway that stops withdraws its report and its keys' usage, rather than leave them to
        its lease's expiry: the others take back its share of each API key's limits at their next
        report. Answered alike whether there was a report or not."""
        gateway = request.match_info["gateway"]
        await self.store.demand.withdraw(gateway)
        return json_response({"gateway": gateway, "gateways": len(await self.store.demand.list())})

    async def versions(self, request: web.Request) -> web.Response:
        """`GET /versions`: this server's llmgw version, each live gateway's (from its report), the
        leading controller-manager's (from its leader key), and each live server's and
        controller-manager's (from their announcements)."""
        gateways = {r.gateway: r.version for r in await self.store.demand.list()}
        leader = await self.store.election.leader("controller-manager")
        manager = {"holder": leader["holder"], "version": leader.get("version")} if leader else None
        members = await self._members()
        return json_response({"server": version(), "gateways": dict(sorted(gateways.items())),
                              "controllerManager": manager,
                              **{group: {m.name: m.version for m in members[group]}
                                 for group in ("servers", "controllerManagers")}})

    async def members(self, request: web.Request) -> web.Response:
        """`GET /members`: the live servers, controller-managers and gateways, each with its version and
        the addresses it announced (llmgw/api/members.py)."""
        return json_response({group: [m.model_dump(mode="json", exclude_none=True) for m in got]
                              for group, got in (await self._members()).items()})

    async def _members(self) -> dict[str, list[Member]]:
        gateways = [Member(name=r.gateway, version=r.version, metrics=r.metrics)
                    for r in await self.store.demand.list()]
        return {"servers": await self.store.members.list("server"),
                "controllerManagers": await self.store.members.list("controller-manager"),
                "gateways": sorted(gateways, key=lambda m: m.name)}

    async def list_usage(self, request: web.Request) -> web.Response:
        """Every API key's usage summed over the live gateways' reports."""
        return json_response(await self._usage(request))

    async def get_usage(self, request: web.Request) -> web.Response:
        """One API key's usage summed over the live gateways; a key no gateway has seen: none."""
        name = request.match_info["name"]
        summed = await self._usage(request)
        await self.store.get(ApiKey, name)   # NotFound (404) for a key that does not exist
        return json_response({"gateways": summed["gateways"], "name": name,
                              "usage": summed["keys"].get(name, KeyUsage().model_dump(mode="json"))})

    async def _usage(self, request: web.Request) -> dict[str, Any]:
        if request.match_info["kind"] != "apikeys":
            raise NotFound(f"usage is kept for apikeys only, not {request.match_info['kind']}")
        reports = await self.store.demand.usage()
        return {"gateways": len(reports),
                "keys": {k: u.model_dump(mode="json") for k, u in sorted(total_usage(reports).items())}}

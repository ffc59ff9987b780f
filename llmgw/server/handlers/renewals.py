"""`POST /renewals`: a node or a component asks for a new certificate for its own identity,
authenticated by the one it holds (docs/contracts.md, "Certificate renewal").

The body is ``{"csr": PEM}``; the answer ``{"certificate": PEM chain, "serial", "notAfter"}``,
signed by the control plane's signing CA (llmgw/pki/signer.py), which refuses any subject but
the asking certificate's (403 rule renewal-identity, logged and audited). A revoked certificate
never gets here (401 at authentication), and the renewal is recorded (/llmgw/renewed/) so that
revoking the certificate it renewed revokes it too (handlers/revocations.py). A token bucket
spreads a fleet asking at once: past it, 429 with retryAfterSeconds, each refused its own slot.
`GET /renewals` lists the renewals recorded (admins: `llmgw ca status --cluster`)."""
from __future__ import annotations

import logging
import time

from aiohttp import web

from llmgw.api.errors import BadRequest, CertificateRevoked, TooManyRequests, Unavailable
from llmgw.pki import Identity, serial_hex
from llmgw.pki.signer import Refused, Signer
from llmgw.server.authz import Denied
from llmgw.server.request import json_response, read_body
from llmgw.store import Store

log = logging.getLogger("llmgw.server")


class TokenBucket:
    """`rate` requests a second on average, `burst` at once. A request refused is told when to come
    back: the next of the slots, `1/rate` apart, handed to those refused before it, so a fleet
    asking at once comes back in turn instead of all at the same moment again."""

    def __init__(self, rate: float, burst: int) -> None:
        self.rate, self.burst = rate, float(burst)
        self.level, self.stamp = float(burst), time.monotonic()
        self.booked = self.stamp   # the last slot handed out

    def take(self) -> float:
        """0 when a request may go now (a token taken), else the seconds until its slot."""
        now = time.monotonic()
        self.level = min(self.burst, self.level + (now - self.stamp) * self.rate)
        self.stamp = now
        if self.level >= 1:
            self.level -= 1
            return 0.0
        self.booked = max(self.booked + 1 / self.rate, now + (1 - self.level) / self.rate)
        return self.booked - now


class Renewals:
    def __init__(self, store: Store, signer: Signer | None, bucket: TokenBucket) -> None:
        self.store, self.signer, self.bucket = store, signer, bucket

    async def list(self, request: web.Request) -> web.Response:
        """GET /renewals: every certificate renewed through the API, for `llmgw ca status` (admins)."""
        who: Identity = request["identity"]
        if who.role != "admin":
            log.warning("refused: certificate %s from %s: the list of renewals", who, request.remote)
            raise Denied("renewals-read", "only admins list the renewed certificates")
        records = await self.store.revocations.renewals()
        return json_response({"kind": "RenewalList", "items": [{"serial": serial, **record}
                                                               for serial, record in sorted(records.items())]})

    async def renew(self, request: web.Request) -> web.Response:
        who: Identity = request["identity"]
        if self.signer is None:
            raise Unavailable("this server signs no renewals: start it with --signer-cert and --signer-key "
                              "(the signer.crt and signer.key of `llmgw ca init`)")
        wait = self.bucket.take()
        if wait:
            raise TooManyRequests(f"too many renewals at once: ask again in {wait:.1f} s", wait)
        body = await read_body(request)
        csr = body.get("csr")
        if not isinstance(csr, str):
            raise BadRequest("csr: required, a PEM certificate signing request")
        try:
            chain, cert = self.signer.renew(csr.encode(), who)
        except Refused as err:
            log.warning("refused: certificate %s from %s: renewal: %s", who, request.remote, err)
            raise Denied("renewal-identity", str(err)) from None
        except ValueError as err:
            raise BadRequest(f"csr: {err}") from None
        serial, not_after = serial_hex(cert.serial_number), cert.not_valid_after_utc.isoformat()
        await self.store.revocations.renewed(serial, who.serial, {"role": who.role, "name": who.name,
                                                                  "notAfter": not_after})
        if await self.store.revocations.is_revoked(who.serial):
            # revoked while this was signed: the revocation may not have seen the renewal's record
            await self.store.revocations.add(serial, {"role": who.role, "name": who.name,
                                                      "revokedBy": "renewal of a revoked certificate"})
            raise CertificateRevoked(f"client certificate {who} is revoked; ask an admin for a new one")
        log.info("certificate %s renewed: serial %s valid until %s", who, serial, not_after)
        return json_response({"certificate": chain.decode(), "serial": serial, "notAfter": not_after}, 201)

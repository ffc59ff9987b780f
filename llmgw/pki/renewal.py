"""A process renews its own certificate before it expires (docs/contracts.md, "Certificate renewal").

    complete_renewal(cert, key)                       # at start, before the files are loaded
    renewer = Renewer(cert, key, authority, reload=[client.use_certificate, ctx.load_cert_chain])
    await renewer.run()                               # forever; renewer.not_after for the metric

At `fraction` of its lifetime (two thirds by default), plus a random part of what is left after
that point (`jitter`: a fleet issued in one week does not ask in one minute), it makes a new key
and a CSR for the same subject, and asks `authority` (the API server, authenticated by the
current certificate) to sign it. The answer must be a certificate for that key and subject; it is
written beside the files (<cert>.next, <key>.next), tried (`authority.try_certificate`: the
server accepts it), and only then moved over the old files, key first, and loaded by every
`reload` (an SSL context's load_cert_chain: new connections present it; those open keep theirs).
A failure keeps the old certificate and is retried after a while; a 429 (the server's rate)
when the server says, plus up to a second. A process that stopped between
the two moves finds <cert>.next alone at its next start: `complete_renewal` moves it in.
"""
from __future__ import annotations

import asyncio
import logging
import os
import random
from collections.abc import Callable, Iterator, Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Protocol

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.metrics_core import Metric

from llmgw.api.errors import TooManyRequests
from llmgw.pki.ca import write_private, write_public

log = logging.getLogger("llmgw.renewal")

FRACTION = 2 / 3
JITTER = 0.1
RETRY = 60.0


class Authority(Protocol):
    """Who signs: llmgw.client.Client."""

    async def renew_certificate(self, csr_pem: str) -> str: ...

    async def try_certificate(self, cert: str, key: str) -> None: ...


def _next(path: str) -> Path:
    return Path(path).with_name(Path(path).name + ".next")


def complete_renewal(cert: str, key: str) -> None:
    """Finish a renewal stopped between its two moves (the key moved, <cert>.next not yet), or
    drop one stopped before them (both .next files: never tried)."""
    cert_next, key_next = _next(cert), _next(key)
    if cert_next.exists() and not key_next.exists():
        os.replace(cert_next, cert)
        log.info("renewal completed at start: %s", cert)
    elif key_next.exists():
        key_next.unlink()
        cert_next.unlink(missing_ok=True)


class Renewer:
    def __init__(self, cert: str, key: str, authority: Authority,
                 reload: Sequence[Callable[[str, str], None]] = (), fraction: float = FRACTION,
                 jitter: float = JITTER, retry: float = RETRY):
        if not 0 < fraction < 1:
            raise ValueError(f"renewal fraction must be between 0 and 1, got {fraction}")
        self.cert_path, self.key_path, self.authority = cert, key, authority
        self.reload, self.fraction, self.jitter, self.retry = list(reload), fraction, jitter, retry
        self.cert = self._load()
        self.renewals = 0

    def _load(self) -> x509.Certificate:
        with open(self.cert_path, "rb") as f:
            return x509.load_pem_x509_certificate(f.read())

    @property
    def not_after(self) -> datetime:
        return self.cert.not_valid_after_utc

    def due(self, now: datetime) -> datetime:
        """When to renew: at `fraction` of the lifetime, plus a random part of the time then left."""
        start, end = self.cert.not_valid_before_utc, self.cert.not_valid_after_utc
        point = max(start + (end - start) * self.fraction, now)
        return point + (end - point) * self.jitter * random.random()

    async def run(self) -> None:
        while True:
            now = datetime.now(timezone.utc)
            await asyncio.sleep((self.due(now) - now).total_seconds())
            while True:
                try:
                    await self.renew()
                    break
                except TooManyRequests as err:   # the server's rate: it said when to come back
                    await asyncio.sleep(err.retry_after + random.uniform(0, 1))
                except Exception as err:  # noqa: BLE001 any failure keeps the old certificate; tried again
                    left = self.not_after - datetime.now(timezone.utc)
                    wait = min(self.retry, max(left.total_seconds() / 20, 1.0)) * random.uniform(0.5, 1.5)
                    log.warning("certificate %s not renewed (%s); it expires %s, trying again in %.0f s",
                                self.cert_path, err, self.not_after.isoformat(), wait)
                    await asyncio.sleep(wait)

    async def renew(self) -> None:
        key = ec.generate_private_key(ec.SECP256R1())
        csr = x509.CertificateSigningRequestBuilder().subject_name(self.cert.subject).sign(key, hashes.SHA256())
        chain = (await self.authority.renew_certificate(csr.public_bytes(serialization.Encoding.PEM).decode())).encode()
        new = x509.load_pem_x509_certificate(chain)
        if new.public_key() != key.public_key() or new.subject != self.cert.subject:
            raise ValueError("the signed certificate is not for this key and subject "
                             f"{self.cert.subject.rfc4514_string()}")
        cert_next, key_next = _next(self.cert_path), _next(self.key_path)
        write_private(key_next, key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                                  serialization.NoEncryption()))
        write_public(cert_next, chain)
        try:
            await self.authority.try_certificate(str(cert_next), str(key_next))
        except BaseException:
            cert_next.unlink(missing_ok=True)
            key_next.unlink(missing_ok=True)
            raise
        os.replace(key_next, self.key_path)
        os.replace(cert_next, self.cert_path)
        for load in self.reload:
            load(self.cert_path, self.key_path)
        old, self.cert = self.cert, new
        self.renewals += 1
        log.info("certificate %s renewed: serial %x valid until %s (was serial %x until %s)", self.cert_path,
                 new.serial_number, new.not_valid_after_utc.isoformat(), old.serial_number,
                 old.not_valid_after_utc.isoformat())


class ExpiryCollector:
    """llmgw_certificate_expiry_timestamp_seconds{certificate}: when each certificate this process
    presents expires (a renewal moves it on), for an alert some days before (deploy/prometheus/)."""

    def __init__(self, certificates: dict[str, Callable[[], datetime]]) -> None:
        self.certificates = certificates   # what it is (node, gateway, server, etcd-client, signer) -> its notAfter

    def collect(self) -> Iterator[Metric]:
        family = GaugeMetricFamily("llmgw_certificate_expiry_timestamp_seconds",
                                   "When a certificate this process presents expires (Unix time); a node's "
                                   "and a gateway's are renewed before", labels=["certificate"])
        for what, not_after in self.certificates.items():
            family.add_metric([what], not_after().timestamp())
        yield family

    @classmethod
    def of_files(cls, files: dict[str, str | None]) -> "ExpiryCollector":
        """Of certificates read once from their files (those that are not renewed: a restart loads new
        ones); a None file is left out."""
        found: dict[str, Callable[[], datetime]] = {}
        for what, path in files.items():
            if path:
                with open(path, "rb") as f:
                    found[what] = _constant(x509.load_pem_x509_certificate(f.read()).not_valid_after_utc)
        return cls(found)


def _constant(at: datetime) -> Callable[[], datetime]:
    return lambda: at

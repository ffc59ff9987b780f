"""The control plane's signing CA: it renews a certificate for the identity that already holds one.

    signer = Signer("signer.crt", "signer.key")
    chain_pem, cert = signer.renew(csr_pem, identity)   # Refused, or ValueError for a CSR that is not one

The signer is a CA below the root (`llmgw ca init` makes it: signer.crt and signer.key beside
ca.crt), with path length 0, so it signs no CA. The API server holds its key and signs with it
only what `renew` allows: a node's or a component's certificate whose subject is exactly the
subject of the certificate that asks (same CN, same O, nothing else), for a key the asker proves it
holds (the CSR's signature), for as long as the asking certificate was valid, and never beyond the
signer's own validity. So it can never make an admin, a user, a server, another node or a new
group: those stay with the root's holder (`llmgw ca issue`).
"""
from __future__ import annotations

from datetime import datetime, timezone

from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from llmgw.pki.ca import ORG, SKEW_ALLOWED, leaf
from llmgw.pki.identity import Identity

RENEWABLE = ("node", "component")


class Refused(Exception):
    """The CSR asks for what the signer does not sign; the message says what."""


class Signer:
    def __init__(self, cert: str, key: str):
        with open(cert, "rb") as f:
            self.chain_pem = f.read()
        self.cert = x509.load_pem_x509_certificate(self.chain_pem)
        with open(key, "rb") as f:
            loaded = serialization.load_pem_private_key(f.read(), password=None)
        if not isinstance(loaded, ec.EllipticCurvePrivateKey):
            raise ValueError(f"{key} is not the EC private key `llmgw ca init` writes for the signer")
        if loaded.public_key() != self.cert.public_key():
            raise ValueError(f"{key} is not the key of {cert}")
        constraints = self.cert.extensions.get_extension_for_class(x509.BasicConstraints).value
        if not constraints.ca:
            raise ValueError(f"{cert} is not a CA certificate (`llmgw ca init` or `llmgw ca issue signer` makes one)")
        self.key = loaded

    @property
    def not_after(self) -> datetime:
        return self.cert.not_valid_after_utc

    def renew(self, csr_pem: bytes, who: Identity, now: datetime | None = None) -> tuple[bytes, x509.Certificate]:
        """A new certificate for `who`, for the key of `csr_pem`: the leaf and the signer's
        certificate, PEM (the chain a client presents). Refused for what it may not sign,
        ValueError for what is not a signed CSR."""
        csr = x509.load_pem_x509_csr(csr_pem)
        if not csr.is_signature_valid:
            raise ValueError("the CSR's signature does not match its key")
        if who.role not in RENEWABLE:
            raise Refused(f"{who.role or 'unknown'} certificates are not renewed through the API (only nodes' "
                          "and components'): ask the CA's holder for a new one (`llmgw ca issue`)")
        subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, who.name),
                             x509.NameAttribute(NameOID.ORGANIZATION_NAME, ORG[who.role])])
        if csr.subject != subject:
            raise Refused(f"the CSR's subject {csr.subject.rfc4514_string()!r} is not this certificate's "
                          f"{subject.rfc4514_string()!r}: a renewal keeps the identity it renews")
        public_key = csr.public_key()
        if not isinstance(public_key, ec.EllipticCurvePublicKey):
            raise ValueError(f"the CSR's key is a {type(public_key).__name__}, not an EC key")
        start = (now or datetime.now(timezone.utc)) - SKEW_ALLOWED
        if start + SKEW_ALLOWED >= self.not_after:
            raise Refused(f"the signer expired at {self.not_after.isoformat()}: "
                          "issue a new one (`llmgw ca issue signer`)")
        end = min(start + (who.not_after - who.not_before), self.not_after)
        cert = leaf(subject, public_key, who.role, start, end, self.cert, self.key)
        return cert.public_bytes(serialization.Encoding.PEM) + self.chain_pem, cert

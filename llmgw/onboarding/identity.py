"""The node certificate onboarding installs: reused from the CA when it has a good one, else issued.

Whatever its origin, a certificate is checked before it leaves this host:
CN = the node id, O = llmgw:nodes, signed by the CA's root, and the key is
its key. A certificate for another node is refused with both names.
"""
from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from pathlib import Path

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization

from llmgw.pki import ORG, CAError, CertificateAuthority, identity_from_cert

RENEW_BEFORE = timedelta(days=30)


class IdentityError(Exception):
    pass


@dataclass(frozen=True)
class NodeIdentity:
    ca_pem: bytes
    cert_pem: bytes
    key_pem: bytes
    serial: str
    issued_now: bool


def check_cert_for_node(cert_pem: bytes, node: str, what: str = "the certificate") -> x509.Certificate:
    try:
        cert = x509.load_pem_x509_certificate(cert_pem)
    except ValueError:
        raise IdentityError(f"{what} is not a PEM certificate") from None
    ident = identity_from_cert(cert)
    if ident.name != node:
        raise IdentityError(f"{what} has CN={ident.name!r}, but the node is {node!r}: a node's certificate "
                            f"must carry CN=<node id> (the server refuses any other); "
                            f"issue one with `llmgw ca issue node {node}`")
    if ident.org != ORG["node"]:
        raise IdentityError(f"{what} has O={ident.org!r}, not {ORG['node']!r}: it is not a node certificate")
    return cert


def _check_chain(cert: x509.Certificate, ca_pem: bytes, what: str) -> None:
    ca = x509.load_pem_x509_certificate(ca_pem)
    try:
        cert.verify_directly_issued_by(ca)
    except (ValueError, TypeError, InvalidSignature):
        raise IdentityError(f"{what} was not issued by this CA ({ca.subject.rfc4514_string()})") from None
    now = datetime.now(timezone.utc)
    if cert.not_valid_after_utc <= now:
        raise IdentityError(f"{what} expired on {cert.not_valid_after_utc:%Y-%m-%d}")


def _check_key(cert: x509.Certificate, key_pem: bytes, what: str) -> None:
    try:
        key = serialization.load_pem_private_key(key_pem, password=None)
    except (ValueError, TypeError):
        raise IdentityError(f"{what}'s key is not an unencrypted PEM private key") from None
    pub = serialization.PublicFormat.SubjectPublicKeyInfo
    if key.public_key().public_bytes(serialization.Encoding.PEM, pub) != \
            cert.public_key().public_bytes(serialization.Encoding.PEM, pub):
        raise IdentityError(f"{what} and its key do not belong together")


def _reusable(ca: CertificateAuthority, node: str) -> tuple[Path, Path] | None:
    """The newest unrevoked node certificate the CA issued to `node` that is valid for a while yet."""
    now = datetime.now(timezone.utc)
    for entry in reversed(ca.index()):
        if entry.role != "node" or entry.name != node or entry.revoked:
            continue
        crt, key = Path(entry.cert), Path(entry.key)
        if not (crt.is_file() and key.is_file()):
            continue
        cert = x509.load_pem_x509_certificate(crt.read_bytes())
        if f"{cert.serial_number:x}" != entry.serial:    # overwritten by a later issue
            continue
        if cert.not_valid_after_utc - RENEW_BEFORE > now:
            return crt, key
    return None


def node_identity(ca_dir: str | Path, node: str, cert: str | None = None, key: str | None = None) -> NodeIdentity:
    ca = CertificateAuthority(ca_dir)
    if not ca.exists():
        raise IdentityError(f"no CA in {ca.dir}: give --ca-dir, or create one with `llmgw ca init --dir DIR`")
    ca_pem = ca.cert_path.read_bytes()
    issued_now = False
    if cert or key:
        if not (cert and key):
            raise IdentityError("--cert and --key go together")
        crt_path, key_path = Path(cert), Path(key)
    else:
        found = _reusable(ca, node)
        if found is None:
            try:
                entry = ca.issue("node", node)
            except CAError as err:
                raise IdentityError(str(err)) from None
            found, issued_now = (Path(entry.cert), Path(entry.key)), True
        crt_path, key_path = found
    what = f"certificate {crt_path}"
    cert_pem, key_pem = crt_path.read_bytes(), key_path.read_bytes()
    parsed = check_cert_for_node(cert_pem, node, what)
    _check_chain(parsed, ca_pem, what)
    _check_key(parsed, key_pem, what)
    return NodeIdentity(ca_pem, cert_pem, key_pem, f"{parsed.serial_number:x}", issued_now)

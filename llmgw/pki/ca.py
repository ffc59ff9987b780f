"""A certificate authority on disk: the root, the certificates it issued, an index.

Layout of a CA directory (mode 0700; every private key 0600):

    ca.crt, ca.key                  the root (ECDSA P-256, self-signed; path length 1)
    signer.crt, signer.key          the signing CA below it (path length 0), for the API
                                    servers, which renew nodes' and components' certificates
                                    with it (llmgw/pki/signer.py): the root's key stays here
    issued/<role>-<name>.crt/.key   each issued certificate and its key
    index.json                      every certificate ever issued: serial, role,
                                    name, validity, revoked (a re-issue keeps the
                                    old entry, so `revoke --node` finds them all)
    revocations.jsonl               the revocation journal: a line per revocation sent,
                                    appended (and fsync'd) before it is sent, so that
                                    etcd restored from an older snapshot gets them again
                                    (`llmgw ca revoke --replay`)
    etcd/                           the etcd CA: a second root, same layout

Roles map to the subject's organisation, which is what the server authorizes:
node -> O=llmgw:nodes (CN = node id), admin -> O=llmgw:admins,
component -> O=llmgw:components (CN controller-manager or gateway),
server -> O=llmgw:servers (with DNS/IP subject alternative names), user -> OU=llmgw:users and an O
per group (CN = the user; what it may do, the Roles bound to it say: llmgw/server/rbac.py).

etcd trusts only the etcd CA, which signs nothing but etcd's certificates: etcd-member ->
O=llmgw:etcd (a member: serves clients and peers, with subject alternative names),
etcd-client -> O=llmgw:etcd-clients (the API server, the controller-manager, an admin who
revokes). So no node certificate, and no admin's API certificate, opens etcd.
"""
from __future__ import annotations

import ipaddress
import json
import os
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from datetime import datetime, timedelta, timezone
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from llmgw.api import check_dns1123_label

USERS_OU = "llmgw:users"
ORG = {"node": "llmgw:nodes", "admin": "llmgw:admins", "component": "llmgw:components", "server": "llmgw:servers",
       "etcd-member": "llmgw:etcd", "etcd-client": "llmgw:etcd-clients", "user": USERS_OU}
ETCD_ROLES = ("etcd-member", "etcd-client")
COMPONENTS = ("controller-manager", "gateway")
DEFAULT_DAYS = 365
USER_DAYS = 7    # a person's certificate is short-lived by default
# A certificate is valid from this long before its issue: a machine whose clock is behind the
# issuer's by up to this much accepts it at once.
SKEW_ALLOWED = timedelta(hours=1)
CA_DAYS = 3650
SIGNER = "llmgw-signer"   # the signing CA's CN


class CAError(Exception):
    """A CA operation that cannot proceed; the message says why and what to do."""


@dataclass
class Issued:
    serial: str  # lower-case hex, as recorded under /llmgw/revoked/
    role: str
    name: str
    not_before: str
    not_after: str
    cert: str
    key: str
    revoked: bool = False


@dataclass(frozen=True)
class Revoked:
    """A line of the revocation journal."""
    serial: str
    role: str | None
    name: str | None
    revokedAt: str  # as the server records it


def serial_hex(serial: int) -> str:
    return format(serial, "x")


def normalize_serial(text: str) -> str:
    """Accept `1a:2b`, `0x1A2B` or `1a2b`; return lower-case hex without leading zeros."""
    s = text.strip().lower().replace(":", "")
    if s.startswith("0x"):
        s = s[2:]
    try:
        return serial_hex(int(s, 16))
    except ValueError:
        raise CAError(f"{text!r} is not a certificate serial (hex digits, as `llmgw ca list` shows)") from None


def write_private(path: Path, data: bytes) -> None:
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    os.chmod(tmp, 0o600)
    os.replace(tmp, path)


def write_public(path: Path, data: bytes) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def _cert_pem(cert: x509.Certificate) -> bytes:
    return cert.public_bytes(serialization.Encoding.PEM)


def _builder(subject: x509.Name, public_key: ec.EllipticCurvePublicKey, issuer: x509.Name,
             issuer_key: ec.EllipticCurvePrivateKey, start: datetime, end: datetime,
             path_length: int | None) -> x509.CertificateBuilder:
    """What every certificate here holds: a CA's (path_length not None) signs certificates, a leaf agrees keys."""
    ca = path_length is not None
    return (
        x509.CertificateBuilder()
        .subject_name(subject).issuer_name(issuer).public_key(public_key)
        .serial_number(x509.random_serial_number())
        .not_valid_before(start).not_valid_after(end)
        .add_extension(x509.BasicConstraints(ca=ca, path_length=path_length), critical=True)
        .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=ca, crl_sign=ca,
                                     content_commitment=False, key_encipherment=False,
                                     data_encipherment=False, key_agreement=not ca,
                                     encipher_only=False, decipher_only=False), critical=True)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(issuer_key.public_key()), critical=False)
    )


def _ca_cert(subject: x509.Name, public_key: ec.EllipticCurvePublicKey, issuer: x509.Name,
             issuer_key: ec.EllipticCurvePrivateKey, start: datetime, end: datetime,
             path_length: int) -> x509.Certificate:
    return (_builder(subject, public_key, issuer, issuer_key, start, end, path_length)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(public_key), critical=False)
            .sign(issuer_key, hashes.SHA256()))


def leaf(subject: x509.Name, public_key: ec.EllipticCurvePublicKey, role: str, start: datetime, end: datetime,
         issuer: x509.Certificate, issuer_key: ec.EllipticCurvePrivateKey,
         sans: Sequence[str] = ()) -> x509.Certificate:
    """A certificate of `role` for `subject`'s key, signed by `issuer` (the root, or the signer)."""
    both = [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]
    # A member serves clients and peers, and dials its peers; the API server serves and dials
    # the agents (their engines' logs); an agent dials the server and serves those logs.
    usage = {"server": both, "etcd-member": both, "node": both,
             }.get(role, [ExtendedKeyUsageOID.CLIENT_AUTH])
    builder = (_builder(subject, public_key, issuer.subject, issuer_key, start, end, None)
               .add_extension(x509.ExtendedKeyUsage(usage), critical=False))
    if sans:
        builder = builder.add_extension(x509.SubjectAlternativeName([_san(s) for s in sans]), critical=False)
    return builder.sign(issuer_key, hashes.SHA256())


class CertificateAuthority:
    def __init__(self, directory: str | Path, for_etcd: bool = False):
        self.dir = Path(directory).expanduser().resolve()
        self.for_etcd = for_etcd  # the etcd CA issues only ETCD_ROLES, the main one everything else

    def etcd(self) -> "CertificateAuthority":
        """The etcd CA in <dir>/etcd, created on first use (a CA made before it existed gets it then)."""
        sub = CertificateAuthority(self.dir / "etcd", for_etcd=True)
        if not sub.exists():
            self._load()  # no etcd CA without the main one
            sub.init("llmgw-etcd-ca")
        return sub

    # ------------------------------------------------------------ paths
    @property
    def cert_path(self) -> Path:
        return self.dir / "ca.crt"

    @property
    def key_path(self) -> Path:
        return self.dir / "ca.key"

    @property
    def index_path(self) -> Path:
        return self.dir / "index.json"

    def exists(self) -> bool:
        return self.cert_path.exists() and self.key_path.exists()

    # ------------------------------------------------------------- init
    def init(self, common_name: str = "llmgw-ca", days: int = CA_DAYS) -> Path:
        if self.exists():
            raise CAError(f"{self.dir} already holds a CA ({self.cert_path}); choose another --dir")
        self.dir.mkdir(parents=True, exist_ok=True)
        os.chmod(self.dir, 0o700)
        (self.dir / "issued").mkdir(mode=0o700, exist_ok=True)
        key = ec.generate_private_key(ec.SECP256R1())
        name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name),
                          x509.NameAttribute(NameOID.ORGANIZATION_NAME, "llmgw")])
        start = datetime.now(timezone.utc) - SKEW_ALLOWED
        # the main root signs one level of CA below it, the signer; the etcd root none
        cert = _ca_cert(name, key.public_key(), name, key, start, start + timedelta(days=days),
                        path_length=0 if self.for_etcd else 1)
        write_private(self.key_path, _key_pem(key))
        write_public(self.cert_path, _cert_pem(cert))
        self._save_index([])
        if not self.for_etcd:
            self.etcd()
            self.issue_signer()
        return self.cert_path

    # ----------------------------------------------------------- signer
    @property
    def signer_cert_path(self) -> Path:
        return self.dir / "signer.crt"

    @property
    def signer_key_path(self) -> Path:
        return self.dir / "signer.key"

    def issue_signer(self, days: int = DEFAULT_DAYS) -> Issued:
        """The signing CA of the control plane (signer.crt, signer.key): a CA below the root that
        signs no CA (path length 0), whose key the API servers hold to renew the certificates of
        nodes and components (llmgw/pki/signer.py); the root's key stays where it is."""
        if self.for_etcd:
            raise CAError("the etcd CA has no signer: etcd's certificates are issued by its holder alone")
        if days <= 0:
            raise CAError(f"validity must be at least one day, got {days}")
        ca_cert, ca_key = self._load()
        constraints = ca_cert.extensions.get_extension_for_class(x509.BasicConstraints).value
        if constraints.path_length == 0:
            raise CAError(f"the root {self.cert_path} signs no CA below it (path length 0: made by "
                          "`llmgw ca init` of llmgw 0.2 or older): renew certificates with `llmgw ca issue` "
                          "(README, \"Certificate renewal\")")
        key = ec.generate_private_key(ec.SECP256R1())
        name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, SIGNER),
                          x509.NameAttribute(NameOID.ORGANIZATION_NAME, "llmgw")])
        start = datetime.now(timezone.utc) - SKEW_ALLOWED
        end = min(start + timedelta(days=days), ca_cert.not_valid_after_utc)
        cert = _ca_cert(name, key.public_key(), ca_cert.subject, ca_key, start, end, path_length=0)
        write_private(self.signer_key_path, _key_pem(key))
        write_public(self.signer_cert_path, _cert_pem(cert))
        entry = Issued(serial=serial_hex(cert.serial_number), role="signer", name=SIGNER,
                       not_before=cert.not_valid_before_utc.isoformat(), not_after=cert.not_valid_after_utc.isoformat(),
                       cert=str(self.signer_cert_path), key=str(self.signer_key_path))
        self._save_index(self.index() + [entry])
        return entry

    def _load(self) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
        if not self.exists():
            raise CAError(f"no CA in {self.dir}: run `llmgw ca init --dir {self.dir}` first")
        cert = x509.load_pem_x509_certificate(self.cert_path.read_bytes())
        key = serialization.load_pem_private_key(self.key_path.read_bytes(), password=None)
        if not isinstance(key, ec.EllipticCurvePrivateKey):  # what init writes; some key types cannot sign
            raise CAError(f"{self.key_path} holds a {type(key).__name__}, not the EC private key of a CA "
                          "made by `llmgw ca init`")
        return cert, key

    # ------------------------------------------------------------ index
    def index(self) -> list[Issued]:
        if not self.index_path.exists():
            return []
        return [Issued(**e) for e in json.loads(self.index_path.read_text())]

    def _save_index(self, entries: list[Issued]) -> None:
        write_public(self.index_path, json.dumps([asdict(e) for e in entries], indent=1).encode())

    # ------------------------------------------------------------ issue
    def issue(self, role: str, name: str, sans: Sequence[str] = (), days: int = DEFAULT_DAYS,
              not_before: datetime | None = None, groups: Sequence[str] = ()) -> Issued:
        """Issue a certificate for `role` (node, admin, component, server, user; etcd-member and
        etcd-client from the etcd CA) named `name`; a user's `groups` are its O values."""
        if role not in ORG:
            raise CAError(f"unknown role {role!r}: use one of {', '.join(ORG)}")
        if (role in ETCD_ROLES) != self.for_etcd:
            which = "the etcd CA (CertificateAuthority.etcd())" if role in ETCD_ROLES else "the main CA"
            raise CAError(f"a {role} certificate comes from {which}, not {self.dir}")
        if groups and role != "user":
            raise CAError("only a user certificate has groups")
        bad = [g for g in groups if not g or g.startswith("llmgw:")]
        if bad:
            raise CAError(f"group {bad[0]!r}: a group is a non-empty name not starting with llmgw: (those are "
                          "the organisations of admins, nodes and components)")
        if role in ("node", "etcd-client", "user"):
            try:
                check_dns1123_label(name)
            except ValueError as err:
                raise CAError(f"{role} name {err}") from None
        if role == "component" and name not in COMPONENTS:
            raise CAError(f"unknown component {name!r}: use one of {', '.join(COMPONENTS)}")
        if role in ("server", "etcd-member") and not sans:
            raise CAError(f"a {role} certificate needs at least one --san (a DNS name or IP address clients dial)")
        if days <= 0:
            raise CAError(f"validity must be at least one day, got {days}")
        ca_cert, ca_key = self._load()
        key = ec.generate_private_key(ec.SECP256R1())
        start = not_before or (datetime.now(timezone.utc) - SKEW_ALLOWED)
        if start.tzinfo is None:
            start = start.replace(tzinfo=timezone.utc)
        orgs = [x509.NameAttribute(NameOID.ORGANIZATION_NAME, g) for g in groups] if role == "user" else [
            x509.NameAttribute(NameOID.ORGANIZATION_NAME, ORG[role])]
        unit = [x509.NameAttribute(NameOID.ORGANIZATIONAL_UNIT_NAME, USERS_OU)] if role == "user" else []
        subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name), *orgs, *unit])
        cert = leaf(subject, key.public_key(), role, start, start + timedelta(days=days), ca_cert, ca_key, sans)
        issued_dir = self.dir / "issued"
        issued_dir.mkdir(mode=0o700, exist_ok=True)
        crt_path, key_path = issued_dir / f"{role}-{name}.crt", issued_dir / f"{role}-{name}.key"
        write_private(key_path, _key_pem(key))
        write_public(crt_path, _cert_pem(cert))
        entry = Issued(serial=serial_hex(cert.serial_number), role=role, name=name,
                       not_before=cert.not_valid_before_utc.isoformat(),
                       not_after=cert.not_valid_after_utc.isoformat(),
                       cert=str(crt_path), key=str(key_path))
        self._save_index(self.index() + [entry])
        return entry

    # ----------------------------------------------------------- revoke
    def serials_of_node(self, node: str) -> list[str]:
        found = [e.serial for e in self.index() if e.role == "node" and e.name == node and not e.revoked]
        if not found:
            raise CAError(f"no unrevoked node certificate for {node!r} in {self.index_path}")
        return found

    def mark_revoked(self, serials: list[str]) -> None:
        wanted = set(serials)
        entries = self.index()
        for e in entries:
            if e.serial in wanted:
                e.revoked = True
        self._save_index(entries)

    def in_use(self) -> list[tuple[str, str, Path]]:
        """(role, name, file) of each certificate of this CA that may be in use: the root, the
        signer, the last unrevoked certificate issued to each identity (its file, which a
        renewal rewrites in place), and the etcd CA's."""
        found: dict[tuple[str, str], Path] = {}
        for e in self.index():
            if not e.revoked:
                found[(e.role, e.name)] = Path(e.cert)
            else:
                found.pop((e.role, e.name), None)
        root = [("etcd-ca" if self.for_etcd else "ca", "", self.cert_path)]
        etcd = self.etcd().in_use() if not self.for_etcd and (self.dir / "etcd").exists() else []
        return root + [(role, name, path) for (role, name), path in found.items()] + etcd

    def find(self, serial: str) -> Issued | None:
        return next((e for e in self.index() if e.serial == serial), None)

    # ------------------------------------------------ revocation journal
    @property
    def journal_path(self) -> Path:
        return self.dir / "revocations.jsonl"

    def journal(self, serials: Sequence[str]) -> list[Revoked]:
        """Append the revocations of serials to the journal, on disk (fsync'd) before they are sent."""
        now = datetime.now(timezone.utc).isoformat()
        entries = []
        for serial in serials:
            issued = self.find(serial)
            entries.append(Revoked(serial, issued.role if issued else None, issued.name if issued else None, now))
        self.dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        with self.journal_path.open("a") as f:
            f.writelines(json.dumps(asdict(e)) + "\n" for e in entries)
            f.flush()
            os.fsync(f.fileno())
        return entries

    def journaled(self) -> list[Revoked]:
        """Every revocation in the journal, oldest first (none without a journal)."""
        if not self.journal_path.exists():
            return []
        entries = []
        for number, line in enumerate(self.journal_path.read_text().splitlines(), 1):
            try:
                entries.append(Revoked(**json.loads(line)))
            except (ValueError, TypeError) as err:
                raise CAError(f"{self.journal_path}, line {number}: not a revocation: {err}") from None
        return entries


def _san(text: str) -> x509.GeneralName:
    try:
        return x509.IPAddress(ipaddress.ip_address(text))
    except ValueError:
        return x509.DNSName(text)

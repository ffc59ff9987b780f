"""Who a client certificate says it is: role and name from its subject.

A person's certificate (`llmgw ca issue user`) says OU=llmgw:users, CN=the user, and an O per
group: its role is "user", whatever its O values, and what it may do is what the Roles bound to
its name and groups grant (llmgw/server/rbac.py)."""
from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timezone

from cryptography import x509
from cryptography.x509.oid import NameOID

from llmgw.pki.ca import ORG, USERS_OU, serial_hex

ROLE_BY_ORG = {org: role for role, org in ORG.items()}


@dataclass(frozen=True)
class Identity:
    role: str | None   # admin | node | component | server | user | None (an organisation llmgw does not know)
    name: str          # the subject's CN
    org: str
    serial: str        # lower-case hex
    not_before: datetime
    not_after: datetime
    groups: tuple[str, ...] = ()   # a user's: every O value

    def __str__(self) -> str:
        return f"CN={self.name} O={self.org} serial={self.serial}"

    @property
    def all_groups(self) -> tuple[str, ...]:
        """Its groups: a user's O values, or the one organisation of an admin, a node, a component."""
        return self.groups or ((self.org,) if self.org else ())

    def expired(self, at: datetime | None = None) -> bool:
        at = at or datetime.now(timezone.utc)
        return at > self.not_after

    def not_yet_valid(self, at: datetime | None = None) -> bool:
        at = at or datetime.now(timezone.utc)
        return at < self.not_before


def _attr(name: x509.Name, oid: x509.ObjectIdentifier) -> str:
    values = name.get_attributes_for_oid(oid)
    return str(values[0].value) if values else ""


def identity_from_cert(cert: x509.Certificate) -> Identity:
    org = _attr(cert.subject, NameOID.ORGANIZATION_NAME)
    user = _attr(cert.subject, NameOID.ORGANIZATIONAL_UNIT_NAME) == USERS_OU
    groups = tuple(str(a.value) for a in cert.subject.get_attributes_for_oid(NameOID.ORGANIZATION_NAME))
    return Identity(
        role="user" if user else ROLE_BY_ORG.get(org), name=_attr(cert.subject, NameOID.COMMON_NAME), org=org,
        serial=serial_hex(cert.serial_number),
        not_before=cert.not_valid_before_utc, not_after=cert.not_valid_after_utc, groups=groups if user else (),
    )


def identity_from_der(der: bytes) -> Identity:
    return identity_from_cert(x509.load_der_x509_certificate(der))


def identity_from_pem_file(path: str) -> Identity:
    with open(path, "rb") as f:
        return identity_from_cert(x509.load_pem_x509_certificate(f.read()))

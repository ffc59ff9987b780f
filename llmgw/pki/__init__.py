"""llmgw's PKI: a CA on disk (`llmgw ca`) and the identities its certificates carry.

    ca = CertificateAuthority(dir); ca.init(); entry = ca.issue("node", "gpu-01")
    entry.cert, entry.key, entry.serial                 # paths and lower-case hex serial
    identity_from_der(der) -> Identity(role, name, org, serial, not_before, not_after)
"""
from llmgw.pki.ca import (
    COMPONENTS,
    DEFAULT_DAYS,
    ETCD_ROLES,
    ORG,
    USER_DAYS,
    USERS_OU,
    CAError,
    CertificateAuthority,
    Issued,
    Revoked,
    normalize_serial,
    serial_hex,
)
from llmgw.pki.identity import Identity, identity_from_cert, identity_from_der, identity_from_pem_file

__all__ = ["COMPONENTS", "DEFAULT_DAYS", "USER_DAYS", "USERS_OU", "ETCD_ROLES", "ORG", "CAError",
           "CertificateAuthority", "Issued", "Revoked",
           "normalize_serial", "serial_hex", "Identity", "identity_from_cert", "identity_from_der",
           "identity_from_pem_file"]

"""The signer renews an identity as it is, for no longer than it lives itself, and nothing else; and
`llmgw ca status` lists what expires when, a renewed file too."""
from __future__ import annotations

from dataclasses import replace
from datetime import timedelta

import pytest
from click.testing import CliRunner
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from llmgw.cli.ca import ca
from llmgw.pki import CAError, CertificateAuthority, identity_from_pem_file
from llmgw.pki.ca import _ca_cert
from llmgw.pki.signer import Refused, Signer
from tests.fixtures.cluster import ca_dir  # noqa: F401


def _csr(*attrs: tuple[x509.ObjectIdentifier, str]) -> bytes:
    name = x509.Name([x509.NameAttribute(oid, value) for oid, value in attrs])
    csr = x509.CertificateSigningRequestBuilder().subject_name(name).sign(ec.generate_private_key(ec.SECP256R1()),
                                                                           hashes.SHA256())
    return csr.public_bytes(serialization.Encoding.PEM)


def _signer(ca_dir) -> Signer:
    return Signer(str(ca_dir.dir / "signer.crt"), str(ca_dir.dir / "signer.key"))


def test_a_renewal_never_outlives_the_signer(ca_dir):
    gw = identity_from_pem_file(ca_dir.issue("component", "gateway", "--days", "3000")[0])
    signer = _signer(ca_dir)
    _, cert = signer.renew(_csr((NameOID.COMMON_NAME, "gateway"), (NameOID.ORGANIZATION_NAME, "llmgw:components")), gw)
    assert cert.not_valid_after_utc == signer.not_after
    eku = cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert [u._name for u in eku] == ["clientAuth"]   # a component's, as the root issues it


@pytest.mark.parametrize("attrs", [
    ((NameOID.COMMON_NAME, "n1"), (NameOID.ORGANIZATION_NAME, "llmgw:nodes"),
     (NameOID.ORGANIZATIONAL_UNIT_NAME, "llmgw:users")),                        # an attribute more
    ((NameOID.COMMON_NAME, "n1"), (NameOID.ORGANIZATION_NAME, "llmgw:nodes"),
     (NameOID.ORGANIZATION_NAME, "ops")),                                        # a group more
    ((NameOID.COMMON_NAME, "n1"),),                                              # no organisation
])
def test_a_subject_not_exactly_the_identity_is_refused(ca_dir, attrs):
    n1 = identity_from_pem_file(ca_dir.issue("node", "n1")[0])
    with pytest.raises(Refused, match="a renewal keeps the identity it renews"):
        _signer(ca_dir).renew(_csr(*attrs), n1)


def test_a_user_is_not_renewed(ca_dir):
    alice = identity_from_pem_file(ca_dir.issue("user", "alice", "--group", "ops")[0])
    with pytest.raises(Refused, match="user certificates are not renewed"):
        _signer(ca_dir).renew(_csr((NameOID.COMMON_NAME, "alice"), (NameOID.ORGANIZATION_NAME, "ops"),
                                   (NameOID.ORGANIZATIONAL_UNIT_NAME, "llmgw:users")), alice)


def test_a_renewal_keeps_the_lifetime_it_renews(ca_dir):
    n2 = identity_from_pem_file(ca_dir.issue("node", "n2", "--days", "2")[0])
    short = replace(n2, not_after=n2.not_before + timedelta(minutes=10))
    _, cert = _signer(ca_dir).renew(_csr((NameOID.COMMON_NAME, "n2"), (NameOID.ORGANIZATION_NAME, "llmgw:nodes")),
                                    short)
    assert cert.not_valid_after_utc - cert.not_valid_before_utc == timedelta(minutes=10)


def test_the_etcd_ca_has_no_signer(ca_dir):
    with pytest.raises(CAError, match="the etcd CA has no signer"):
        CertificateAuthority(ca_dir.dir).etcd().issue_signer()


def test_a_root_of_path_length_0_gets_no_signer_and_says_what_to_do(ca_dir):
    """A root made before the signer (path length 0) cannot sign one: the error says so."""
    authority = CertificateAuthority(ca_dir.dir)
    root, key = authority._load()
    start = root.not_valid_before_utc
    old = _ca_cert(root.subject, key.public_key(), root.subject, key, start, root.not_valid_after_utc, path_length=0)
    authority.cert_path.write_bytes(old.public_bytes(serialization.Encoding.PEM))
    with pytest.raises(CAError, match="path length 0"):
        authority.issue_signer()


def test_ca_status_lists_every_certificate_soonest_first_with_days_left(ca_dir, tmp_path):
    ca_dir.issue("node", "n3", "--days", "10")
    ca_dir.issue("etcd-client", "llmgw-server", "--days", "20")
    n3 = identity_from_pem_file(str(ca_dir.dir / "issued" / "node-n3.crt"))
    chain, cert = _signer(ca_dir).renew(_csr((NameOID.COMMON_NAME, "n3"), (NameOID.ORGANIZATION_NAME, "llmgw:nodes")),
                                        replace(n3, not_after=n3.not_before + timedelta(days=5)))
    renewed = tmp_path / "node.crt"   # where a node renewed its own
    renewed.write_bytes(chain)
    out = CliRunner().invoke(ca, ["status", "--dir", str(ca_dir.dir), "--file", str(renewed)])
    assert out.exit_code == 0, out.output
    rows = [line.split() for line in out.output.splitlines()[1:]]
    assert [(r[0], r[1]) for r in rows] == [
        ("node", "n3"), ("node", "n3"), ("etcd-client", "llmgw-server"), ("signer", "llmgw-signer"),
        ("ca", "llmgw-ca"), ("etcd-ca", "llmgw-etcd-ca")]
    assert rows[0][2] == format(cert.serial_number, "x") and rows[0][5] == str(renewed)
    assert [r[4] for r in rows[:3]] == ["5.0", "10.0", "20.0"]   # days left (an hour of skew allowance off)
    bad = CliRunner().invoke(ca, ["status", "--dir", str(ca_dir.dir), "--file", str(tmp_path / "none.crt")])
    assert bad.exit_code == 1 and bad.output.count("\n") == 1 and "none.crt: not a readable certificate" in bad.output

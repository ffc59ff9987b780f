"""`llmgw ca`: root, issued certificates, revocation recorded in etcd, client config."""
from __future__ import annotations

import asyncio
import stat
from datetime import datetime, timezone

import pytest
from click.testing import CliRunner
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, x25519
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from llmgw.cli.ca import ca
from llmgw.client import ApiError, ClientConfig, Forbidden
from llmgw.pki import CAError, CertificateAuthority, identity_from_pem_file
from tests.fixtures.cluster import api_server, ca_dir, llmgw_ca  # noqa: F401


def _cert(path) -> x509.Certificate:
    return x509.load_pem_x509_certificate(open(path, "rb").read())


def _mode(path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_init_makes_p256_root_with_private_files(ca_dir):
    root = _cert(ca_dir.ca)
    assert isinstance(root.public_key(), ec.EllipticCurvePublicKey)
    assert root.public_key().curve.name == "secp256r1"
    assert root.extensions.get_extension_for_class(x509.BasicConstraints).value.ca is True
    assert _mode(ca_dir.dir / "ca.key") == 0o600
    assert _mode(ca_dir.dir) == 0o700
    again = CliRunner().invoke(ca, ["init", "--dir", str(ca_dir.dir)])
    assert again.exit_code != 0 and "already holds a CA" in again.output


def test_node_certificate_names_the_node_and_is_signed_by_the_root(ca_dir):
    cert_path, key_path = ca_dir.issue("node", "gpu-07", "--days", "30")
    cert, root = _cert(cert_path), _cert(ca_dir.ca)
    assert cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value == "gpu-07"
    assert cert.subject.get_attributes_for_oid(NameOID.ORGANIZATION_NAME)[0].value == "llmgw:nodes"
    cert.verify_directly_issued_by(root)
    days = (cert.not_valid_after_utc - cert.not_valid_before_utc).days
    assert days == 30
    eku = cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert list(eku) == [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]  # serves its logs
    assert _mode(ca_dir.dir / "issued" / "node-gpu-07.key") == 0o600
    ident = identity_from_pem_file(cert_path)
    assert (ident.role, ident.name) == ("node", "gpu-07")


def test_default_validity_is_one_year(ca_dir):
    cert = _cert(ca_dir.issue("admin", "alice")[0])
    assert (cert.not_valid_after_utc - cert.not_valid_before_utc).days == 365
    assert cert.subject.get_attributes_for_oid(NameOID.ORGANIZATION_NAME)[0].value == "llmgw:admins"


def test_server_certificate_carries_its_sans(ca_dir):
    cert = _cert(ca_dir.issue("server", "api", "--san", "10.1.2.3", "--san", "api.example")[0])
    san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert [str(ip) for ip in san.get_values_for_type(x509.IPAddress)] == ["10.1.2.3"]
    assert san.get_values_for_type(x509.DNSName) == ["api.example"]
    no_san = CliRunner().invoke(ca, ["issue", "server", "--dir", str(ca_dir.dir)])
    assert no_san.exit_code != 0


def test_bad_names_are_refused_with_one_line(ca_dir):
    bad_node = CliRunner().invoke(ca, ["issue", "node", "GPU_1", "--dir", str(ca_dir.dir)])
    assert bad_node.exit_code != 0 and "DNS-1123" in bad_node.output
    bad_component = CliRunner().invoke(ca, ["issue", "component", "scheduler", "--dir", str(ca_dir.dir)])
    assert bad_component.exit_code != 0 and "controller-manager" in bad_component.output
    no_ca = CliRunner().invoke(ca, ["issue", "node", "n1", "--dir", str(ca_dir.dir / "missing")])
    assert no_ca.exit_code != 0 and "llmgw ca init" in no_ca.output


def test_component_certificate(ca_dir):
    ident = identity_from_pem_file(ca_dir.issue("component", "gateway")[0])
    assert (ident.role, ident.name, ident.org) == ("component", "gateway", "llmgw:components")


def test_list_shows_expired_and_valid(ca_dir):
    ca_dir.issue("node", "fresh")
    ca_dir.issue("node", "stale", "--not-before", "2020-01-01", "--days", "1")
    rows = {line.split()[2]: line for line in llmgw_ca("list", "--dir", str(ca_dir.dir)).splitlines()[1:]}
    assert rows["fresh"].endswith("valid") and rows["stale"].endswith("expired")


async def test_revoke_records_serials_through_the_server(api_server, ca_dir, store, tmp_path):
    config = tmp_path / "alice.yaml"    # an admin's API certificate is all it takes: no etcd certificate
    llmgw_ca("issue", "admin", "alice", "--dir", str(ca_dir.dir), "--write-config", "--server", api_server.url,
             "--config", str(config))
    first = CertificateAuthority(ca_dir.dir).issue("node", "n1").serial
    second = CertificateAuthority(ca_dir.dir).issue("node", "n1").serial   # re-issued: both get revoked
    other = CertificateAuthority(ca_dir.dir).issue("node", "n2").serial
    # the CLI runs its own event loop: call it from a thread
    out = await asyncio.to_thread(llmgw_ca, "revoke", "--node", "n1", "--dir", str(ca_dir.dir), "--config", str(config))
    assert first in out and second in out
    revoked = await store.revocations.list()
    assert set(revoked) == {first, second}
    assert (revoked[first]["role"], revoked[first]["name"], revoked[first]["revokedBy"]) == ("node", "n1", "alice")
    await asyncio.to_thread(llmgw_ca, "revoke", other.upper(), "--dir", str(ca_dir.dir), "--config", str(config))
    assert other in await store.revocations.list()
    rows = [line.split() for line in llmgw_ca("list", "--dir", str(ca_dir.dir)).splitlines()[1:]]
    assert [r[-1] for r in rows if r[1] == "node"] == ["revoked", "revoked", "revoked"]


async def test_only_an_admin_revokes(api_server, store):
    """Not a node, not the controller-manager (which may do anything else); a bad serial is a 400."""
    for ident in (api_server.issue_node("n1"), api_server.issue_component("controller-manager")):
        async with api_server.client(ident) as c:
            with pytest.raises(Forbidden, match="rule revoke-admin: only an admin"):
                await c.revoke("1f")
    assert await store.revocations.list() == {}
    line = api_server.wait_for_log("tried to revoke a certificate")
    assert "refused: certificate CN=n1 O=llmgw:nodes" in line
    async with api_server.client() as admin:
        with pytest.raises(ApiError, match="serial: 'xyz' is not a certificate serial") as err:
            await admin.revoke("xyz")
        assert err.value.code == 400


def test_revoke_without_a_server_says_where(ca_dir):
    serial = CertificateAuthority(ca_dir.dir).issue("node", "n1").serial
    cert, key = ca_dir.issue("admin", "alice")
    res = CliRunner().invoke(ca, ["revoke", serial, "--dir", str(ca_dir.dir), "--server", "https://127.0.0.1:1",
                                  "--ca", ca_dir.ca, "--cert", cert, "--key", key])
    assert res.exit_code == 3 and "https://127.0.0.1:1" in res.output and "Traceback" not in res.output


def test_write_config_gives_a_loadable_client_config(ca_dir, tmp_path):
    path = tmp_path / "config.yaml"
    llmgw_ca("issue", "admin", "bob", "--dir", str(ca_dir.dir), "--write-config",
             "--server", "https://10.0.0.1:7443", "--config", str(path))
    cfg = ClientConfig.load(path)
    assert cfg.server == "https://10.0.0.1:7443"
    assert identity_from_pem_file(cfg.cert).name == "bob"
    assert cfg.ca == str(ca_dir.dir / "ca.crt")
    assert _mode(path) == 0o600


def test_not_before_moves_validity(ca_dir):
    cert = _cert(ca_dir.issue("node", "late", "--not-before", "2030-05-01")[0])
    assert cert.not_valid_before_utc == datetime(2030, 5, 1, tzinfo=timezone.utc)


def test_etcd_certificates_come_from_a_separate_etcd_ca(ca_dir):
    """etcd trusts only the etcd CA: no node or admin certificate of the main root can open it."""
    etcd_root = _cert(ca_dir.dir / "etcd" / "ca.crt")       # made by `llmgw ca init`
    out = llmgw_ca("issue", "etcd-member", "etcd1", "--san", "10.0.0.5", "--san", "etcd1.example",
                   "--dir", str(ca_dir.dir))
    member = _cert(ca_dir.dir / "etcd" / "issued" / "etcd-member-etcd1.crt")
    assert "serial" in out
    member.verify_directly_issued_by(etcd_root)
    eku = list(member.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value)
    assert eku == [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]  # serves, and dials peers
    llmgw_ca("issue", "etcd-client", "controller-manager", "--dir", str(ca_dir.dir))
    client = _cert(ca_dir.dir / "etcd" / "issued" / "etcd-client-controller-manager.crt")
    client.verify_directly_issued_by(etcd_root)
    assert client.subject.get_attributes_for_oid(NameOID.ORGANIZATION_NAME)[0].value == "llmgw:etcd-clients"
    node = _cert(ca_dir.issue("node", "gpu-01")[0])
    assert node.issuer != etcd_root.subject
    listed = llmgw_ca("list", "--dir", str(ca_dir.dir))
    roles_names = {tuple(line.split()[1:3]) for line in listed.splitlines()[1:]}
    assert {("etcd-member", "etcd1"), ("etcd-client", "controller-manager")} <= roles_names
    no_san = CliRunner().invoke(ca, ["issue", "etcd-member", "etcd2", "--dir", str(ca_dir.dir)])
    assert no_san.exit_code != 0 and "--san" in no_san.output
    with pytest.raises(CAError, match="comes from the etcd CA"):
        CertificateAuthority(ca_dir.dir).issue("etcd-client", "x")


def test_a_ca_key_that_is_not_ec_is_refused_with_one_line(ca_dir):
    key = x25519.X25519PrivateKey.generate()  # cannot sign a certificate
    (ca_dir.dir / "ca.key").write_bytes(key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()))
    result = CliRunner().invoke(ca, ["issue", "node", "n1", "--dir", str(ca_dir.dir)])
    assert result.exit_code != 0 and isinstance(result.exception, SystemExit)  # not a traceback
    assert "ca.key holds a X25519PrivateKey, not the EC private key" in result.output

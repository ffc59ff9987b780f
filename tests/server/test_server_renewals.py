"""POST /renewals: a node or a component renews its own certificate through the server's signer,
and nothing else; a revoked certificate's renewals are revoked with it. And the client's switch to
a new certificate (Client.use_certificate): the requests made after it present the new one, and a
watch opened before it goes on: it ends at its next line and resumes on the new session, before
the old session closes (the server's bookmarks come every second here)."""
from __future__ import annotations

import asyncio
import ssl
from datetime import datetime, timedelta, timezone

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from llmgw.api import Model, Node
from llmgw.client import Forbidden, TooManyRequests, Unauthorized
from llmgw.pki import identity_from_pem_file
from llmgw.server.handlers.renewals import TokenBucket
from tests.fixtures.cluster import llmgw_ca, shared_api_server, until_revoked  # noqa: F401
from tests.fixtures.poll import until


def _csr(cn: str, org: str) -> tuple[ec.EllipticCurvePrivateKey, str]:
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn),
                         x509.NameAttribute(NameOID.ORGANIZATION_NAME, org)])
    csr = x509.CertificateSigningRequestBuilder().subject_name(subject).sign(key, hashes.SHA256())
    return key, csr.public_bytes(serialization.Encoding.PEM).decode()


def _write(tmp_path, name: str, key: ec.EllipticCurvePrivateKey, chain: str) -> tuple[str, str]:
    cert_path, key_path = tmp_path / f"{name}.crt", tmp_path / f"{name}.key"
    cert_path.write_text(chain)
    key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    return str(cert_path), str(key_path)


async def test_a_node_renews_its_own_certificate_and_both_work(shared_api_server, tmp_path):
    srv = shared_api_server
    yesterday = (datetime.now(timezone.utc) - timedelta(days=1)).strftime("%Y-%m-%dT%H:%M:%S")
    old = srv.issue_node("renewing", "--days", "3", "--not-before", yesterday)
    key, csr = _csr("renewing", "llmgw:nodes")
    async with srv.client(old) as c:
        chain = await c.renew_certificate(csr)
    new = _write(tmp_path, "renewing", key, chain)
    before, after = identity_from_pem_file(old[0]), identity_from_pem_file(new[0])
    assert (after.role, after.name) == ("node", "renewing") and after.serial != before.serial
    assert after.not_after - after.not_before == before.not_after - before.not_before   # the same lifetime
    assert after.not_after > before.not_after
    for ident in (new, old):   # the new one is accepted, and the old one still is
        async with srv.client(ident) as c:
            assert (await c.whoami())["name"] == "renewing"
    # the chain: the leaf, then the signer, which the root signed (ssl verifies it as a server would)
    ctx = ssl.create_default_context(cafile=srv.ca)
    ctx.load_cert_chain(*new)
    leaf, signer = x509.load_pem_x509_certificates(chain.encode())
    signer.verify_directly_issued_by(x509.load_pem_x509_certificate(open(srv.ca, "rb").read()))
    leaf.verify_directly_issued_by(signer)
    assert signer.extensions.get_extension_for_class(x509.BasicConstraints).value.path_length == 0
    srv.wait_for_log("certificate CN=renewing O=llmgw:nodes")
    # `llmgw ca status --cluster` shows it, as the servers recorded it; a node may not list them
    out = await asyncio.to_thread(llmgw_ca, "status", "--dir", str(srv.pki.dir), "--cluster", "--server", srv.url,
                                  "--ca", srv.ca, "--cert", srv.admin[0], "--key", srv.admin[1])
    row = next(line.split() for line in out.splitlines() if after.serial in line)
    assert row[:2] == ["node", "renewing"] and row[-1] == "renewed", out
    async with srv.client(new) as c:
        with pytest.raises(Forbidden, match="renewals-read"):
            await c.renewals()


@pytest.mark.parametrize(("cn", "org", "why"), [
    ("other-node", "llmgw:nodes", "is not this certificate's"),     # another node's name
    ("greedy", "llmgw:admins", "is not this certificate's"),        # an admin
])
async def test_another_identity_is_refused_logged_and_audited(shared_api_server, cn, org, why):
    srv = shared_api_server
    _, csr = _csr(cn, org)
    async with srv.client(srv.issue_node("greedy")) as c:
        with pytest.raises(Forbidden) as err:
            await c.renew_certificate(csr)
    assert "renewal-identity" in str(err.value) and why in str(err.value)
    line = srv.wait_for_log(f"CN={cn}")
    assert "refused: certificate CN=greedy O=llmgw:nodes" in line and "renewal" in line


async def test_an_admin_is_not_renewed_through_the_api(shared_api_server):
    srv = shared_api_server
    _, csr = _csr("dev-admin", "llmgw:admins")
    async with srv.client() as c:
        with pytest.raises(Forbidden) as err:
            await c.renew_certificate(csr)
    assert "admin certificates are not renewed through the API" in str(err.value)


async def test_revoking_a_certificate_revokes_its_renewals_and_none_renews_after(shared_api_server, tmp_path):
    srv = shared_api_server
    old = srv.issue_node("gone")
    key, csr = _csr("gone", "llmgw:nodes")
    async with srv.client(old) as c:
        await c.create(Node.model_validate({"metadata": {"name": "gone"}}))
        new = _write(tmp_path, "gone", key, await c.renew_certificate(csr))
    # the admin revokes what the CA's index knows, the node's first certificate
    out = await asyncio.to_thread(llmgw_ca, "revoke", "--node", "gone", "--dir", str(srv.pki.dir), "--server",
                                  srv.url, "--ca", srv.ca, "--cert", srv.admin[0], "--key", srv.admin[1])
    assert out.strip().endswith(f"and its renewals {identity_from_pem_file(new[0]).serial}"), out
    async with srv.client(new) as c:
        await until_revoked(c, "gone")   # the renewal is refused with it
        with pytest.raises(Unauthorized):
            await c.renew_certificate(_csr("gone", "llmgw:nodes")[1])
    async with srv.client(old) as c:
        with pytest.raises(Unauthorized):
            await c.renew_certificate(csr)


def test_the_token_bucket_gives_each_refused_request_its_own_slot():
    bucket = TokenBucket(rate=10.0, burst=3)
    assert [bucket.take() for _ in range(3)] == [0.0, 0.0, 0.0]
    # the next three are told to come back one after the other, a token's time apart
    assert [bucket.take() for _ in range(3)] == pytest.approx([0.1, 0.2, 0.3], abs=0.01)
    bucket.stamp -= 0.1         # a tenth of a second later: a token
    assert bucket.take() == 0.0


def _model(name: str) -> Model:
    return Model.model_validate({"metadata": {"name": name}, "spec": {"profiles": [{"engine": "sim"}]}})


async def test_new_requests_present_the_new_certificate_and_a_watch_goes_on(shared_api_server):
    srv = shared_api_server
    other = srv.issue_admin("second-admin")   # another name, so the server says which one it saw
    seen: list[str] = []
    async with srv.client(timeout=1.0) as c:
        async def watch() -> None:
            async for type_, obj in c.list_and_watch(Model):
                if isinstance(obj, Model):
                    seen.append(f"{type_} {obj.metadata.name}")
        watching = asyncio.create_task(watch())
        await c.create(_model("before"))
        await until(lambda: "ADDED before" in seen, "the watch to see the first model")
        assert (await c.whoami())["name"] == "dev-admin"
        c.use_certificate(*other)
        assert (await c.whoami())["name"] == "second-admin"
        await asyncio.sleep(1.5)   # past the client's timeout: the old session closed
        await c.create(_model("after"))

        def went_on() -> bool:
            if watching.done():   # what ended the watch, raised now rather than after the timeout
                raise AssertionError(f"the watch ended: {watching!r}")
            return "ADDED after" in seen
        await until(went_on, "the watch to go on past the old session's close")
        watching.cancel()
    assert seen.count("ADDED before") == 1   # resumed from its revision, not relisted as new


async def test_past_the_rate_a_renewal_is_told_when_to_come_back(shared_api_server):
    """The server's default burst is 50: of 60 asked at once, some are 429 with their slots, in turn.
    (Last in this module: it empties the bucket its other tests renew from.)"""
    srv = shared_api_server
    async with srv.client(srv.issue_node("eager")) as c:
        answers = await asyncio.gather(*(c.renew_certificate(_csr("eager", "llmgw:nodes")[1]) for _ in range(60)),
                                       return_exceptions=True)
    refused = sorted(a.retry_after for a in answers if isinstance(a, TooManyRequests))
    assert refused and all(isinstance(a, (str, TooManyRequests)) for a in answers), answers
    assert 0 < refused[0] < refused[-1] and len(set(refused)) == len(refused)   # a slot each

"""Refused certificates: unknown CA, expired, revoked, wrong purpose, none; and what each side says."""
from __future__ import annotations

import asyncio
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from llmgw import aio
from llmgw.api import Model, Node, Shard, parse_object
from llmgw.client import Client, TLSError, Unauthorized, Unreachable
from llmgw.dev.process import free_port
from tests.fixtures.cluster import ca_dir, llmgw_ca, make_pki, shared_api_server, until_revoked  # noqa: F401


async def test_unknown_ca_is_refused_and_logged(shared_api_server, tmp_path):
    stranger = make_pki(tmp_path / "other-ca").issue("admin", "mallory")
    async with shared_api_server.client(stranger) as c:
        with pytest.raises(TLSError) as err:
            await c.list(Model)
    assert err.value.side == "client"
    assert "CA the server does not trust" in str(err.value)
    line = shared_api_server.wait_for_log("not signed by the cluster CA")
    assert "refused: TLS handshake from 127.0.0.1:" in line and "unknown CA" in line


async def test_expired_certificate_is_refused_and_logged(shared_api_server):
    old = shared_api_server.issue_node("old-node", "--not-before", "2020-01-01", "--days", "1")
    async with shared_api_server.client(old) as c:
        with pytest.raises(Unauthorized) as err:
            await c.list(Shard, node="old-node")
    assert err.value.reason == "CertificateExpired" and "expired at 2020-01-02" in str(err.value)
    line = shared_api_server.wait_for_log("refused: certificate CN=old-node")
    assert "expired at 2020-01-02" in line


def test_the_server_issues_no_session_ticket(shared_api_server):
    """TLS 1.3 session tickets are never resumed by the cluster's clients and cost the server a
    third of each handshake: it sends none (llmgw/pki/tls.py). A ticket arrives after the
    handshake, so the client reads an answer first."""
    import socket
    import ssl
    from urllib.parse import urlsplit

    ctx = ssl.create_default_context(cafile=shared_api_server.ca)
    ctx.load_cert_chain(*shared_api_server.admin)
    url = urlsplit(shared_api_server.url)
    with socket.create_connection((url.hostname, url.port), timeout=10) as raw, \
            ctx.wrap_socket(raw, server_hostname=url.hostname) as tls:
        tls.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        answer = b""
        while chunk := tls.recv(65536):
            answer += chunk
        assert answer.startswith(b"HTTP/1.1 200"), answer[:200]
        assert tls.version() == "TLSv1.3"
        assert tls.session is not None and not tls.session.has_ticket


def _as_admin(srv) -> list[str]:
    """The connection flags of `llmgw ca revoke` for the server's admin."""
    return ["--server", srv.url, "--ca", srv.ca, "--cert", srv.admin[0], "--key", srv.admin[1]]


async def test_revoked_certificate_is_refused_and_logged(shared_api_server):
    srv = shared_api_server
    ident = srv.issue_node("doomed")
    async with srv.client(ident) as c:
        await c.create(Node.model_validate({"metadata": {"name": "doomed"}}))   # it registers,
        await c.heartbeat("doomed")  # and its heartbeat is accepted before the revocation
        out = await asyncio.to_thread(llmgw_ca, "revoke", "--node", "doomed", "--dir", str(srv.pki.dir),
                                      *_as_admin(srv))
        serial = out.split()[-1]
        await until_revoked(c, "doomed")
        with pytest.raises(Unauthorized) as err:   # on the heartbeat stream opened before the revocation
            await c.heartbeat("doomed")
        assert err.value.reason == "CertificateRevoked"
    line = srv.wait_for_log(f"serial={serial} from")
    assert "refused: certificate CN=doomed O=llmgw:nodes" in line and line.endswith("is revoked")


def _shard(name: str, node: str):
    return parse_object({"apiVersion": "llmgw.io/v1", "kind": "Shard", "metadata": {"name": name},
                         "spec": {"replica": "r", "model": "m", "node": node, "rank": 0, "worldSize": 1,
                                  "ports": {"serve": 30000, "distInit": 30001}, "headAddress": "127.0.0.1",
                                  "engine": "sim", "servedModelNames": ["m"]}})


async def _open_watch(srv, ident, node: str):
    """A watch of `node`'s shards by `ident`, once it is open (its first event arrived)."""
    async with srv.client() as admin:
        await admin.create(_shard(f"{node}-s", node))
    client = srv.client(ident)
    events = client.watch(Shard, node=node)
    first = await anext(events)
    assert first.object.name == f"{node}-s"
    return client, events


async def _end_of(events) -> Unauthorized:
    """The error that ends `events`; bounded, since without it the watch streams forever."""
    async with asyncio.timeout(60):
        with pytest.raises(Unauthorized) as err:
            async for _ in events:
                pass
    return err.value


async def test_revocation_ends_an_open_watch_with_a_logged_reason(shared_api_server):
    srv = shared_api_server
    ident = srv.issue_node("watch-doomed")
    client, events = await _open_watch(srv, ident, "watch-doomed")
    async with client:
        out = await asyncio.to_thread(llmgw_ca, "revoke", "--node", "watch-doomed", "--dir", str(srv.pki.dir),
                                      *_as_admin(srv))
        err = await _end_of(events)
    assert err.reason == "CertificateRevoked" and "was revoked" in str(err)
    line = srv.wait_for_log("watch of shards by certificate CN=watch-doomed")
    assert f"serial={out.split()[-1]} from 127.0.0.1 ended: was revoked" in line


async def test_a_watch_ends_when_its_certificate_expires(shared_api_server):
    srv = shared_api_server
    # valid for one day, of which 8 seconds are left
    start = datetime.now(timezone.utc) - timedelta(days=1) + timedelta(seconds=8)
    ident = srv.issue_node("short-lived", "--not-before", start.strftime("%Y-%m-%dT%H:%M:%S"), "--days", "1")
    client, events = await _open_watch(srv, ident, "short-lived")
    async with client:
        err = await _end_of(events)
    assert err.reason == "CertificateExpired" and "expired at" in str(err)
    line = srv.wait_for_log("watch of shards by certificate CN=short-lived")
    assert line.split("ended: ")[1].startswith("expired at ")


def server_only_certificate(pki, out: Path) -> tuple[str, str]:
    """An admin's name, signed by the cluster's CA, for serving alone (extended key usage
    serverAuth): every certificate llmgw issues that serves (server, node) also dials now."""

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    ca_cert = x509.load_pem_x509_certificate((pki.dir / "ca.crt").read_bytes())
    ca_key = serialization.load_pem_private_key((pki.dir / "ca.key").read_bytes(), password=None)
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.now(timezone.utc)
    cert = (x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "serving-only"),
                                     x509.NameAttribute(NameOID.ORGANIZATION_NAME, "llmgw:admins")]))
            .issuer_name(ca_cert.subject).public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - timedelta(minutes=5)).not_valid_after(now + timedelta(days=1))
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
            .sign(ca_key, hashes.SHA256()))  # type: ignore[arg-type]
    crt, pem = out / "serving-only.crt", out / "serving-only.key"
    crt.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    pem.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                      serialization.NoEncryption()))
    return str(crt), str(pem)


async def test_wrong_purpose_certificate_is_refused(shared_api_server, tmp_path):
    srv = shared_api_server
    async with srv.client(server_only_certificate(srv.pki, tmp_path)) as c:
        with pytest.raises(TLSError) as err:
            await c.list(Model)
    assert err.value.side == "client"
    assert "unsuitable certificate purpose" in srv.wait_for_log("client certificate rejected")


async def test_missing_client_certificate(shared_api_server):
    async with Client(shared_api_server.url, ca=shared_api_server.ca) as c:
        with pytest.raises(TLSError) as err:
            await c.list(Model)
    assert err.value.side == "client" and "requires a client certificate" in str(err.value)
    shared_api_server.wait_for_log("no client certificate presented")


async def test_client_distrusting_the_server_says_so(shared_api_server, tmp_path):
    other_ca = make_pki(tmp_path / "other").ca
    cert, key = shared_api_server.admin
    async with Client(shared_api_server.url, ca=other_ca, cert=cert, key=key) as c:
        with pytest.raises(TLSError) as err:
            await c.list(Model)
    assert err.value.side == "server" and "not trusted" in str(err.value)


async def test_unreachable_names_the_url(ca_dir):
    cert, key = ca_dir.issue("admin", "a")
    url = f"https://127.0.0.1:{free_port()}"
    async with Client(url, ca=ca_dir.ca, cert=cert, key=key) as c:
        with pytest.raises(Unreachable) as err:
            await c.list(Model)
    assert str(err.value).startswith(f"cannot reach the llmgw server at {url}/apis/llmgw.io/v1/models")
    assert "\n" not in str(err.value)


def test_unreadable_client_key_is_a_client_side_tls_error(ca_dir, tmp_path):
    cert, _ = ca_dir.issue("admin", "a")
    with pytest.raises(TLSError) as err:
        Client("https://127.0.0.1:1", ca=ca_dir.ca, cert=cert, key=str(tmp_path / "nope.key"))
    assert err.value.side == "client" and "nope.key" in str(err.value)


@pytest.mark.parametrize("run", [aio.run, asyncio.run], ids=["uvloop", "asyncio"])
def test_handshakes_beyond_the_limit_wait_their_turn(tmp_path, run):
    """A listener that runs one TLS handshake at a time (llmgw/server/tls.py): connections that
    send nothing hold it until their handshakes time out; a client that came meanwhile waits its
    turn, reading nothing, and is then served, its handshake timed from its own start. On the
    server's loop (uvloop, which reads a connection from its start, its ClientHello included,
    even when it is paused as it is made) and on asyncio's."""
    run(_handshakes_wait_their_turn(tmp_path))


async def _handshakes_wait_their_turn(tmp_path):
    from aiohttp import web

    from llmgw.pki.ca import CertificateAuthority
    from llmgw.pki.tls import mtls_server_context
    from llmgw.server.tls import TLSSite

    ca = CertificateAuthority(tmp_path / "ca")
    ca.init()
    server, node = ca.issue("server", "llmgw-server", ["127.0.0.1"]), ca.issue("node", "n1")

    async def whoami(_: web.Request) -> web.Response:
        return web.json_response({"name": "n1"})
    app = web.Application()
    app.router.add_get("/apis/llmgw.io/v1/whoami", whoami)
    runner = web.AppRunner(app)
    await runner.setup()
    port = free_port()
    site = TLSSite(runner, "127.0.0.1", port, handshake_timeout=1.0, handshakes=1,
                   ssl_context=mtls_server_context(server.cert, server.key, str(ca.cert_path)))
    await site.start()
    try:
        # two connections that send nothing hold the one handshake for a timeout each, longer
        # than those behind them may wait if each were timed from its connection
        silent = [(await asyncio.open_connection("127.0.0.1", port))[1] for _ in range(2)]
        url, tls = f"https://127.0.0.1:{port}", {"ca": str(ca.cert_path), "cert": node.cert, "key": node.key}
        async with Client(url, **tls, timeout=0.3) as c:
            with pytest.raises(Unreachable):   # its turn does not come while they hold it
                await c.whoami()
        async with Client(url, **tls) as c:
            answers = await asyncio.gather(*(c.whoami() for _ in range(3)))
        assert answers == [{"name": "n1"}] * 3
        for writer in silent:
            writer.close()
    finally:
        await runner.cleanup()

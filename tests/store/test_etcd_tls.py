"""etcd secured end to end: TLS with client certificates from the etcd CA, and nothing else gets in."""
from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import urllib.request

import pytest
from click.testing import CliRunner

from llmgw.api import Node, parse_object
from llmgw.cli.ca import ca as ca_command
from llmgw.dev.etcd import etcd_cluster
from llmgw.dev.process import free_port
from llmgw.pki import CertificateAuthority
from llmgw.store import Store, StoreUnavailable
from tests.fixtures.cluster import api_server, ca_dir, make_pki, start_api_server, until_revoked  # noqa: F401
from tests.fixtures.poll import until_sync


@pytest.fixture
def secured(tmp_path):
    """A CA (with its etcd CA) and a one-member etcd that requires a client certificate from the etcd CA."""
    pki = make_pki(tmp_path / "ca")
    etcd = etcd_cluster(tmp_path / "etcd", 1, ca=CertificateAuthority(pki.dir)).start()
    yield pki, etcd
    etcd.stop()


def _etcd_client(pki, name: str) -> list[str]:
    """--etcd-ca/--etcd-cert/--etcd-key for an etcd-client certificate issued to `name`."""
    issued = CertificateAuthority(pki.dir).etcd().issue("etcd-client", name)
    return ["--etcd-ca", str(pki.dir / "etcd" / "ca.crt"), "--etcd-cert", issued.cert, "--etcd-key", issued.key]


async def test_etcd_refuses_clients_without_an_etcd_client_certificate(secured):
    pki, etcd = secured
    assert etcd.endpoint.startswith("https://")
    etcd_ca = str(pki.dir / "etcd" / "ca.crt")
    node_cert, node_key = pki.issue("node", "gpu-01")        # signed by the main root, not the etcd CA
    refused = {
        "no certificate": Store(etcd.endpoint, ca=etcd_ca),
        "a node's certificate": Store(etcd.endpoint, ca=etcd_ca, cert=node_cert, key=node_key),
    }
    for what, store in refused.items():
        with pytest.raises(StoreUnavailable) as err:
            await store.connect()
        await store.close()
        assert "etcd refused this client's TLS certificate" in str(err.value), what
        assert "\n" not in str(err.value)
    plain = Store(etcd.endpoint.replace("https://", "http://"))
    with pytest.raises(StoreUnavailable, match="requires TLS"):
        await plain.connect()
    await plain.close()
    args = _etcd_client(pki, "controller-manager")
    async with Store(etcd.endpoint, ca=args[1], cert=args[3], key=args[5]) as store:
        await store.revocations.add("abc", {"name": "x"})
        assert "abc" in await store.revocations.list()


async def test_server_and_revocation_over_tls_etcd(secured, tmp_path):
    pki, etcd = secured
    server = start_api_server(pki, etcd.endpoint, tmp_path, *_etcd_client(pki, "llmgw-server"))
    try:
        node = pki.issue("node", "n1")
        async with server.client(node) as c:
            await c.create(Node.model_validate({"metadata": {"name": "n1"}}))   # registers, then heartbeats
            await c.heartbeat("n1")
        async with server.client() as admin:
            await admin.create(parse_object({"apiVersion": "llmgw.io/v1", "kind": "Model", "metadata": {"name": "m"},
                                             "spec": {"profiles": [{"engine": "sim"}]}}))
        # the admin revokes through the server, which writes etcd with its own etcd certificate
        revoke = ["revoke", "--node", "n1", "--dir", str(pki.dir), "--server", server.url, "--ca", pki.ca,
                  "--cert", server.admin[0], "--key", server.admin[1]]
        done = await asyncio.to_thread(CliRunner().invoke, ca_command, revoke)
        assert done.exit_code == 0, done.output
        async with server.client(node) as c:
            await until_revoked(c, "n1")
        assert not any("without TLS" in line or "without a client" in line for line in server.log_lines())
    finally:
        server.stop()


async def test_three_members_form_a_cluster_over_peer_tls(tmp_path):
    """Member certificates serve clients and authenticate to peers (--peer-client-cert-auth)."""
    authority = CertificateAuthority(make_pki(tmp_path / "ca").dir)
    etcd = etcd_cluster(tmp_path / "etcd", 3, ca=authority).start()
    try:
        client = authority.etcd().issue("etcd-client", "controller-manager")
        tls = dict(ca=str(authority.etcd().cert_path), cert=client.cert, key=client.key)
        async with Store(etcd.endpoints[0], **tls) as first:
            await first.revocations.add("1f", {"name": "n1"})
        async with Store(etcd.endpoints[2], **tls) as third:     # replicated to another member
            assert "1f" in await third.revocations.list()
    finally:
        etcd.stop()


def test_a_server_on_plain_etcd_warns_once(api_server):
    line = api_server.wait_for_log("without TLS")
    assert "WARNING" in line and "Production security" in line
    assert sum("without TLS" in line for line in api_server.log_lines()) == 1


async def test_a_refused_certificate_is_not_waited_for(secured, caplog):
    """A TLS refusal is a configuration to fix: connect's wait for etcd gives up on it at once."""
    pki, etcd = secured
    node_cert, node_key = pki.issue("node", "gpu-02")
    store = Store(etcd.endpoint, ca=str(pki.dir / "etcd" / "ca.crt"), cert=node_cert, key=node_key)
    with pytest.raises(StoreUnavailable) as err:
        await store.connect(wait=600)
    await store.close()
    assert err.value.misconfigured and "refused this client's TLS certificate" in str(err.value)
    assert "does not answer yet" not in caplog.text


def test_a_controller_manager_started_while_etcd_is_silent_waits_for_it(secured, tmp_path):
    """etcd SIGSTOPped (restarting, or without a quorum): with --etcd-wait 0 the controller-manager
    gives up in one line, no traceback; with the default wait it says it is waiting, and runs once
    etcd answers. First seen failing: it exited 1 with a traceback (the soak, seed 5150, started
    one right after etcd's quorum came back)."""
    pki, etcd = secured
    args = [sys.executable, "-m", "llmgw.cli.main", "controller-manager", "--etcd", etcd.endpoint,
            *_etcd_client(pki, "controller-manager")]
    member = etcd.members[0].proc
    os.kill(member.pid, signal.SIGSTOP)
    try:
        quick = subprocess.run([*args, "--etcd-wait", "0", "--metrics-listen", ""], capture_output=True, text=True,
                               timeout=120)
        assert quick.returncode == 1, quick.stderr
        last = quick.stderr.strip().splitlines()[-1]
        assert last.startswith("Error: cannot reach etcd at https://") and "Traceback" not in quick.stderr, \
            quick.stderr
        port = free_port()
        log = tmp_path / "cm.log"
        with open(log, "wb") as out:
            cm = subprocess.Popen([*args, "--metrics-listen", f"127.0.0.1:{port}"], stdout=out,
                                  stderr=subprocess.STDOUT)
        try:
            until_sync(lambda: "etcd does not answer yet" in log.read_text(), "the controller-manager waiting",
                       timeout=60, detail=log.read_text)
            os.kill(member.pid, signal.SIGCONT)

            def healthy() -> bool:
                assert cm.poll() is None, log.read_text()
                try:
                    with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=2) as r:
                        return r.status == 200
                except OSError:
                    return False
            until_sync(healthy, "the controller-manager serving once etcd answers", timeout=90,
                       detail=log.read_text)
        finally:
            cm.terminate()
            cm.wait(30)
    finally:
        os.kill(member.pid, signal.SIGCONT)

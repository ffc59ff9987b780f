"""An agent renews its certificate at a fraction of its lifetime, with its engine, its Node and its
listener as they were: the engine keeps its pid, the Node stays Ready, the listener serves the new
certificate (a certificate of one day, issued so that its two thirds fall seconds after the start)."""
from __future__ import annotations

import asyncio
import socket
import ssl
from datetime import datetime, timedelta, timezone

import aiohttp
from cryptography import x509

from llmgw.api import Node, condition_true
from llmgw.pki import identity_from_pem_file, serial_hex
from tests.agent.test_agent_e2e import AgentProcess, kill_recorded_engines, shard_in, sim_shard, wait_for
from tests.fixtures.cluster import shared_api_server  # noqa: F401

RENEW_AFTER = 10.0   # seconds after the certificate is issued: the agent started and its engine too by then


def _served_serial(endpoint: str, server) -> str:
    """The serial of the certificate the agent's listener serves (a handshake as the admin)."""
    host, port = endpoint.removeprefix("https://").rsplit(":", 1)
    ctx = ssl.create_default_context(cafile=server.ca)
    ctx.check_hostname = False
    ctx.load_cert_chain(*server.admin)
    with socket.create_connection((host, int(port)), timeout=10) as sock, ctx.wrap_socket(sock) as tls:
        der = tls.getpeercert(binary_form=True)
    return serial_hex(x509.load_der_x509_certificate(der).serial_number)


async def test_an_agent_renews_without_touching_its_engine_node_or_listener(shared_api_server, tmp_path):
    srv, node = shared_api_server, "renew-1"
    (tmp_path / "agent.yaml").write_text("renew-jitter: 0\n")
    agent = AgentProcess(srv, node, tmp_path, "--logs-listen", "127.0.0.1:0",
                         "--config", str(tmp_path / "agent.yaml"))
    # a day's certificate whose two thirds (16 h) fall RENEW_AFTER seconds from now
    start = datetime.now(timezone.utc) - timedelta(hours=16) + timedelta(seconds=RENEW_AFTER)
    cert, _ = srv.issue_node(node, "--days", "1", "--not-before", start.strftime("%Y-%m-%dT%H:%M:%S"))
    old = identity_from_pem_file(cert)
    agent.start()
    try:
        async with srv.client() as c:
            await c.create(sim_shard("renew-1-a", node))
            shard = await shard_in(c, "renew-1-a", agent, "Ready")
            endpoint = (await c.get(Node, node)).status.agentEndpoint
            assert endpoint
            not_ready: list[str] = []

            async def watch_ready() -> None:   # the Node, every 0.2 s, until the renewal is seen
                while True:
                    n = await c.get(Node, node)
                    if not condition_true(n.status.conditions, "Ready"):
                        not_ready.append(str(n.status.conditions))
                    await asyncio.sleep(0.2)
            watching = asyncio.create_task(watch_ready())
            await wait_for("the certificate renewed", lambda: "renewed: serial" in agent.log.read_text(), agent)
            log = agent.log.read_text()
            assert log.index(f"(pid {shard.status.pid})") < log.index("renewed: serial"), \
                "the renewal came before the engine started: raise RENEW_AFTER"
            new = identity_from_pem_file(cert)
            assert new.serial != old.serial and (new.role, new.name) == ("node", node)
            assert new.not_after > old.not_after
            # the listener serves the new certificate from its next handshake
            assert _served_serial(endpoint, srv) == new.serial
            # heartbeats go on with the new certificate: the Node stays Ready a few beats more
            await asyncio.sleep(2)
            watching.cancel()
            assert not not_ready, not_ready
            after = await shard_in(c, "renew-1-a", agent, "Ready")
            assert after.status.pid == shard.status.pid, "the engine was restarted"
            async with aiohttp.ClientSession() as http, \
                    http.get(f"http://127.0.0.1:{shard.spec.ports.serve}/health") as resp:
                assert resp.status == 200   # the engine serves as it did
    finally:
        agent.stop()
        kill_recorded_engines(agent.state_dir)

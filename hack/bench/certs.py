"""A fleet whose certificates all reach their renewal point in the same minute: 1,000 agents renewing.

This starts etcd and a real `llmgw server` with its signer, registers `--agents` Nodes as hollow
agents do (llmgw/hollow.py: Ready, heartbeating through the store), and gives each a node
certificate of one day, all issued at the same instant, so that their two thirds fall at the
same moment, `--lead` seconds from the start. Each agent's renewal is what a real agent runs
(llmgw/pki/renewal.py's Renewer over its own REST client, its connection open beforehand as a
running agent's is), with the agent's jitter squeezed so that every one falls within
`--window` seconds (the default 60: the same minute; 0: all at once). The server signs at most
`--renewal-rate` a second (`--renewal-burst` at once) and answers 429 past it; an agent told so
tries again after 30 to 90 s (its retry, a minute jittered). It reports how long the last renewal
came after the renewal point, how many were not renewed within `--deadline`, the 429s, and the
server's CPU over the renewals.

    .venv/bin/python hack/bench/certs.py                     # 1,000 agents, the same minute
    .venv/bin/python hack/bench/certs.py --window 0          # all in the same second

Figures (the shared 2-core machine, 2026-12-06, the server's defaults: 20/s and a burst of 50; a
429 comes back at the slot it was given; the load average from other work in brackets):

| agents | window | renew_s | failed | 429s | server CPU | agents' CPU |
|---|---|---|---|---|---|---|
| 1,000 | 60 s (the same minute) | 67.3 (load 6-10) | 0 | 0 | 8.1 s | 11.3 s |
| 1,000 | 60 s | 160.4 (load 12-17) | 0 | 110 | 9.9 s | |
| 1,000 | 0 (the same second) | 81.5 (load 11-13) | 0 | 939 | 9.8 s | 13.0 s |
| 1,000 | 0 | 163.2 (load 12-17) | 0 | 942 | 9.6 s | |

So a renewal costs the server 8-10 ms of CPU, all in, and 1,000 asking at once are refused and
taken back in turn, without a failure and without more server CPU than when spread over a
minute (each refusal is cheap: it comes before the CSR is read). Spread by the agents' jitter
over a minute, they stay under the server's rate: the last renews as the minute ends, none
refused. At once, the last of 1,000 is due 47.5 s after the first at 20/s; the rest of the 81.5 s
was the machine's, as were the 160 s under a heavier load: the agents (this one process: keys,
CSRs, two TLS handshakes per renewal, in Python) and the server shared two cores with a dozen
other busy processes. Before the slots (a 429 waited the Renewer's retry, 30 to 90 s), the
same-minute run under load gave 158.1 s with 38 refusals waiting up to 90 s each.

Every renewal is two requests (the signing, then a whoami with the new certificate on a new
connection) and three TLS handshakes at the server (the renewal's connection, the try, and the
next connection of the agent's client).
"""
from __future__ import annotations

import argparse
import asyncio
import logging
import sys
import tempfile
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from controlplane import cpu_seconds  # the script beside this one (hack/bench/)
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from llmgw.client import ApiError, Client
from llmgw.dev.apiserver import start_api_server
from llmgw.dev.etcd import etcd_cluster
from llmgw.hollow import FakeAgents
from llmgw.pki import ORG
from llmgw.pki.ca import CertificateAuthority, leaf
from llmgw.pki.renewal import FRACTION, Renewer
from llmgw.store import Store

LIFETIME = timedelta(days=1)


class Counted:
    """An agent's client as the Renewer's authority, counting the server's 429s."""

    def __init__(self, client: Client, refused: list[int]) -> None:
        self.client, self.refused = client, refused

    async def renew_certificate(self, csr_pem: str) -> str:
        try:
            return await self.client.renew_certificate(csr_pem)
        except ApiError as err:
            if err.code == 429:
                self.refused[0] += 1
            raise

    async def try_certificate(self, cert: str, key: str) -> None:
        await self.client.try_certificate(cert, key)


def issue(work: Path, ca_dir: Path, names: list[str], not_before: datetime) -> list[tuple[str, str]]:
    """Node certificates of one day, all from `not_before`, signed by the root (as `llmgw ca issue
    node` signs them, without its index: a thousand rewrites of it would be most of the setup)."""
    root = x509.load_pem_x509_certificate((ca_dir / "ca.crt").read_bytes())
    root_key = serialization.load_pem_private_key((ca_dir / "ca.key").read_bytes(), password=None)
    assert isinstance(root_key, ec.EllipticCurvePrivateKey)
    out = []
    (work / "nodes").mkdir()
    for name in names:
        key = ec.generate_private_key(ec.SECP256R1())
        subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name),
                             x509.NameAttribute(NameOID.ORGANIZATION_NAME, ORG["node"])])
        cert = leaf(subject, key.public_key(), "node", not_before, not_before + LIFETIME, root, root_key)
        cert_path, key_path = work / "nodes" / f"{name}.crt", work / "nodes" / f"{name}.key"
        cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                               serialization.NoEncryption()))
        out.append((str(cert_path), str(key_path)))
    return out


async def main(args: argparse.Namespace) -> None:
    logging.basicConfig(level=logging.ERROR)   # each 429 is a warning of its agent's: thousands
    names = [f"node-{i:04d}" for i in range(args.agents)]
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        etcd = etcd_cluster(work / "etcd", size=1).start()
        CertificateAuthority(work / "ca").init()
        server = start_api_server(work / "ca", etcd.endpoint, work, "--renewal-rate", str(args.renewal_rate),
                                  "--renewal-burst", str(args.renewal_burst))
        clients: list[Client] = []
        tasks: list[asyncio.Task[None]] = []
        try:
            store = await Store(etcd.endpoint).connect()
            hollow = await FakeAgents(store, names, workers=32, heartbeat_ttl=600).start()
            due = datetime.now(timezone.utc) + timedelta(seconds=args.lead)
            certs = issue(work, work / "ca", names, due - LIFETIME * FRACTION)
            refused = [0]
            renewers = []
            for cert, key in certs:
                client = Client(server.url, ca=server.ca, cert=cert, key=key)
                clients.append(client)
                renewers.append(Renewer(cert, key, Counted(client, refused), reload=[client.use_certificate],
                                        jitter=args.window / (LIFETIME * (1 - FRACTION)).total_seconds()))
            for i in range(0, len(clients), 50):   # each agent's connection open, as a running agent's is
                await asyncio.gather(*(c.whoami() for c in clients[i:i + 50]))
            wait = (due - datetime.now(timezone.utc)).total_seconds()
            assert wait > 0, f"the setup took past the renewal point: raise --lead above {args.lead}"
            tasks = [asyncio.create_task(r.run()) for r in renewers]
            await asyncio.sleep(wait)
            c0, t0, own0 = cpu_seconds(server.proc.pid), time.monotonic(), time.process_time()
            last = 0.0
            while time.monotonic() - t0 < args.deadline:
                done = sum(r.renewals > 0 for r in renewers)
                if done == len(renewers):
                    break
                await asyncio.sleep(0.2)
                last = time.monotonic() - t0
            renew_s, cpu, own = last, cpu_seconds(server.proc.pid) - c0, time.process_time() - own0
            failed = sum(r.renewals == 0 for r in renewers)
            await hollow.stop()
            await store.close()
        finally:
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            for c in clients:
                await c.close()
            server.stop()
            etcd.stop()
    print(f"{args.agents} agents due within {args.window:.0f} s; the server signs {args.renewal_rate:g}/s "
          f"(burst {args.renewal_burst}): the last renewed {renew_s:.1f} s after the renewal point, "
          f"{failed} not renewed within {args.deadline:.0f} s, {refused[0]} answers 429, server CPU {cpu:.1f} s, "
          f"the agents' (this process's) {own:.1f} s")
    print(f"certs: agents={args.agents} renew_s={renew_s:.1f} failed={failed} refused_429={refused[0]} "
          f"server_cpu_s={cpu:.1f} agents_cpu_s={own:.1f}")


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--agents", type=int, default=1000)
    p.add_argument("--window", type=float, default=60.0, help="Seconds the renewals' jitter spreads them over.")
    p.add_argument("--lead", type=float, default=90.0, help="Seconds from the start to the renewal point.")
    p.add_argument("--deadline", type=float, default=600.0, help="Seconds after it a renewal counts as failed.")
    p.add_argument("--renewal-rate", type=float, default=20.0)
    p.add_argument("--renewal-burst", type=int, default=50)
    asyncio.run(main(p.parse_args()))

"""`llmgw gateway --server`: its component certificate renewed at a fraction of its lifetime, while
it serves; its routing table still follows the server, and its metric shows the new expiry."""
from __future__ import annotations

import subprocess
from datetime import datetime, timedelta, timezone

import aiohttp

from llmgw.dev.process import free_port
from llmgw.pki import identity_from_pem_file
from tests.fixtures.cluster import shared_api_server  # noqa: F401
from tests.fixtures.gateway import CLI, Sim, metric
from tests.fixtures.poll import until
from tests.gateway.test_gateway_watch import make_ready, new_model


async def test_a_gateway_renews_while_it_serves(shared_api_server, tmp_path):
    srv = shared_api_server
    sims = [Sim.start("llama", "small", wait=False) for _ in range(2)]
    # a day's certificate that expires 30 s from now: past its two thirds, renewed at the start
    start = datetime.now(timezone.utc) - timedelta(days=1) + timedelta(seconds=30)
    cert, key = srv.issue("component", "gateway", "--days", "1", "--not-before", start.strftime("%Y-%m-%dT%H:%M:%S"))
    old = identity_from_pem_file(cert)
    port, log_path = free_port(), tmp_path / "gateway.log"
    url = f"http://127.0.0.1:{port}"
    with open(log_path, "wb") as log:
        gw = subprocess.Popen([*CLI, "gateway", "--listen", f"127.0.0.1:{port}", "--server", srv.url, "--ca", srv.ca,
                               "--cert", cert, "--key", key], stdout=log, stderr=subprocess.STDOUT)
    try:
        for s in sims:
            s.wait_ready()
        async with srv.client() as admin, aiohttp.ClientSession() as http:
            await admin.create(new_model())
            await make_ready(admin, "r-a", sims[0].endpoint)

            async def answer(path: str = "/metrics") -> tuple[int, str]:
                try:
                    async with http.get(url + path) as r:
                        return r.status, await r.text()
                except aiohttp.ClientConnectionError:
                    return 0, ""

            async def routable() -> float:
                status, text = await answer()
                return metric(text, "llmgw_gateway_routable_replicas", model="llama") if status == 200 else -1

            async def ask() -> int:
                async with http.post(url + "/v1/completions", json={"model": "small", "prompt": "x",
                                                                    "max_tokens": 1}) as r:
                    await r.read()
                    return r.status

            await until(lambda: "renewed: serial" in log_path.read_text(), "the gateway's certificate renewed")
            new = identity_from_pem_file(cert)
            assert new.serial != old.serial and new.not_after > old.not_after
            _, text = await answer()
            assert metric(text, "llmgw_certificate_expiry_timestamp_seconds", certificate="gateway") \
                == new.not_after.timestamp()
            # its watch goes on: a replica made Ready after the renewal is routed to
            await make_ready(admin, "r-b", sims[1].endpoint)
            await until(lambda: _is(routable(), 2), "r-b routable after the renewal")
            assert [await ask() for _ in range(4)] == [200] * 4
    finally:
        gw.terminate()
        assert gw.wait(15) == 0, log_path.read_text()[-3000:]
        for s in sims:
            s.stop()


async def _is(coro, value) -> bool:
    return await coro == value

"""The API server's /metrics (--metrics-listen, plain HTTP): requests by verb, kind and code, and
the watches open, from a real server process."""
from __future__ import annotations

import asyncio
import contextlib
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from llmgw.api import Model
from llmgw.client import NotFound
from llmgw.dev.process import free_port
from tests.fixtures.cluster import ca_dir, start_api_server  # noqa: F401
from tests.fixtures.poll import until_sync


def scrape(port: int) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as resp:
        text = resp.read().decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for f in text_string_to_metric_families(text) for s in f.samples if s.name.startswith("llmgw_server_")}


async def test_requests_and_watches_are_counted(etcd, ca_dir, tmp_path):
    port = free_port()
    server = start_api_server(ca_dir, etcd.endpoint, tmp_path, "--metrics-listen", f"127.0.0.1:{port}")
    try:
        async with server.client() as c:
            with pytest.raises(NotFound):
                await c.get(Model, "absent")
            await c.list(Model)
            watching = c.watch(Model, resource_version=0)
            first = asyncio.ensure_future(watching.__anext__())
            open_ = await asyncio.to_thread(until_sync, lambda: scrape(port).get(
                ("llmgw_server_watches", (("kind", "models"),))) == 1 or None, "a watch of models open")
            assert open_
            first.cancel()   # the client goes away: the server's watch ends
            with contextlib.suppress(asyncio.CancelledError):
                await first
            await watching.aclose()
        got = await asyncio.to_thread(until_sync, lambda: (s := scrape(port)).get(
            ("llmgw_server_watches", (("kind", "models"),))) == 0 and s, "the watch closed")
    finally:
        server.stop()
    assert got[("llmgw_server_requests_total", (("code", "404"), ("kind", "models"), ("verb", "get")))] == 1
    assert got[("llmgw_server_requests_total", (("code", "200"), ("kind", "models"), ("verb", "list")))] == 1
    assert got[("llmgw_server_requests_total", (("code", "200"), ("kind", "models"), ("verb", "watch")))] == 1

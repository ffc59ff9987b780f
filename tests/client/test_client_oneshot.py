"""Client(oneshot=True), the CLI's requests through http.client (llmgw.client.oneshot): the same
answers and the same errors as through aiohttp, against a real server, and a connection the
server dropped while idle replaced."""
from __future__ import annotations

import pytest

from llmgw.api import Model, Node, parse_object
from llmgw.client import Client, Forbidden, NotFound, TLSError, Unreachable
from llmgw.dev.process import free_port
from tests.fixtures.cluster import api_server, ca_dir, make_pki, shared_api_server  # noqa: F401

BOTH = pytest.mark.parametrize("oneshot", [False, True], ids=["aiohttp", "oneshot"])


def model(name: str) -> Model:
    return parse_object({"apiVersion": "llmgw.io/v1", "kind": "Model", "metadata": {"name": name},
                         "spec": {"replicas": 0, "profiles": [{"engine": "sim"}]}})


async def error_of(client: Client, call) -> str:
    async with client as c:
        with pytest.raises(Exception) as err:
            await call(c)
    return f"{type(err.value).__name__}: {err.value}"


@BOTH
async def test_same_answers(shared_api_server, oneshot):
    async with shared_api_server.client(oneshot=oneshot) as c:
        created = await c.create(model(f"one-{int(oneshot)}"))
        assert (await c.get(Model, created.name)).metadata.uid == created.metadata.uid
        items, rv = await c.list(Model)
        assert created.name in {m.name for m in items} and rv >= created.metadata.resourceVersion
        assert (await c.apply(model(f"one-{int(oneshot)}")))[0] == "unchanged"
        assert (await c.delete(Model, created.name)).name == created.name


async def test_same_errors(shared_api_server, tmp_path):
    srv = shared_api_server
    other_ca = make_pki(tmp_path / "other-ca")
    stranger = other_ca.issue("admin", "mallory")
    node = srv.issue_node("oneshot-node")
    dead = f"https://127.0.0.1:{free_port()}"
    cases = {
        "not found": (lambda o: srv.client(oneshot=o), lambda c: c.get(Model, "no-such-model"), NotFound),
        "forbidden": (lambda o: srv.client(node, oneshot=o), lambda c: c.create(model("by-a-node")), Forbidden),
        "server not trusted": (lambda o: Client(srv.url, ca=other_ca.ca, cert=srv.admin[0], key=srv.admin[1],
                                                oneshot=o), lambda c: c.list(Node), TLSError),
        "client not trusted": (lambda o: srv.client(stranger, oneshot=o), lambda c: c.list(Node), TLSError),
        "refused": (lambda o: Client(dead, ca=srv.ca, cert=srv.admin[0], key=srv.admin[1], oneshot=o),
                    lambda c: c.list(Node), Unreachable),
    }
    for what, (make, call, kind) in cases.items():
        through_aiohttp = await error_of(make(False), call)
        through_http_client = await error_of(make(True), call)
        assert through_aiohttp.startswith(kind.__name__), (what, through_aiohttp)
        assert through_http_client == through_aiohttp, what


async def test_a_connection_dropped_while_idle_is_replaced(api_server):
    async with api_server.client(oneshot=True) as c:
        await c.create(model("before"))
        api_server.restart()            # same port: the client's idle connection is now closed
        await c.create(model("after"))  # on a new connection, once
        assert {m.name for m in (await c.list(Model))[0]} == {"before", "after"}

"""`GET /api/v1/nodes?weights=SOURCE[&digest=...]`: the Nodes a pull may read from, answered from
the server's index of the nodes' weights (llmgw/server/weightsindex.py), kept current by a watch."""
from __future__ import annotations

import signal
import urllib.parse

import pytest

from llmgw.api import Node
from llmgw.client import Unavailable
from llmgw.dev.etcd import etcd_cluster
from llmgw.dev.process import freeze
from llmgw.server.weightsindex import SYNC_TIMEOUT
from tests.fixtures.cluster import make_pki, shared_api_server, start_api_server  # noqa: F401
from tests.fixtures.poll import until

SOURCE = "hf://org/m@" + "c" * 40
DIGEST = "sha256:" + "ab" * 32
OTHER = "sha256:" + "cd" * 32
T0 = "2026-12-05T00:00:00Z"


def weights(models=(), pulls=()):
    return {"agentEndpoint": "https://10.0.0.1:9443", "weights": {"models": list(models), "pulls": list(pulls)}}


async def names(client, source, digest=None) -> list[str]:
    return [n.name for n in await client.nodes_with_weights(source, digest)]


async def test_the_nodes_holding_or_pulling_a_source_and_only_those_follow_their_status(shared_api_server):
    s = shared_api_server
    statuses = {
        "wi-holder": weights(models=[{"digest": DIGEST, "sources": [SOURCE]}]),
        "wi-by-digest": weights(models=[{"digest": DIGEST}]),      # the same content, from a manifest
        "wi-puller": weights(pulls=[{"source": SOURCE, "startedAt": T0}]),
        "wi-other": weights(models=[{"digest": OTHER, "sources": ["hf://org/other"]}]),
        "wi-empty": weights(),
        "wi-none": {},
    }
    async with s.client() as admin, s.client(s.issue_node("wi-me")) as me:
        for name, status in statuses.items():
            await admin.create(Node.model_validate({"metadata": {"name": name}}))
            if status:
                await admin.patch_status(Node, name, status)
        # A node asks (any node may: it learns which peers serve what it pulls).
        assert await names(me, SOURCE) == ["wi-holder", "wi-puller"]
        assert await names(me, SOURCE, DIGEST) == ["wi-by-digest", "wi-holder", "wi-puller"]
        assert await names(me, DIGEST) == ["wi-by-digest", "wi-holder"]
        assert await names(me, "hf://org/nobody") == []
        got = {n.name: n for n in await me.nodes_with_weights(SOURCE)}
        assert got["wi-puller"].status.weights.pulls[0].source == SOURCE      # whole Nodes, as a list gives them

        # Later writes reach the index by its watch: a model dropped, a pull begun, a Node deleted.
        await admin.patch_status(Node, "wi-holder", weights())
        await admin.patch_status(Node, "wi-none", weights(pulls=[{"source": SOURCE, "startedAt": T0}]))
        await admin.delete(Node, "wi-puller")

        async def moved():
            return await names(me, SOURCE, DIGEST) == ["wi-by-digest", "wi-none"]
        await until(moved, "the index to follow the Nodes' status writes and deletion")
        assert await names(me, OTHER) == ["wi-other"]


@pytest.mark.parametrize(("path", "field"), [
    ("nodes?weights=", "weights:"),
    ("models?weights=" + urllib.parse.quote(SOURCE), "weights:"),
    ("nodes?weights=x&watch=true", "weights:"),
    ("nodes?weights=x&labelSelector=a%3Db", "weights:"),
    ("nodes?weights=x&digest=sha256:12", "digest:"),
])
def test_a_bad_weights_query_is_a_400_naming_its_field(shared_api_server, path, field):
    code, body = shared_api_server.send(shared_api_server.admin, "GET", "/" + path)
    assert code == 400, body
    assert body["reason"] == "BadRequest" and body["message"].startswith(field), body


async def test_a_question_the_index_cannot_list_for_is_a_503_and_it_answers_once_etcd_is_back(tmp_path):
    etcd = etcd_cluster(tmp_path / "etcd", size=1).start()
    server = start_api_server(make_pki(tmp_path / "ca"), etcd.endpoint, tmp_path)
    member = etcd.members[0].proc
    try:
        async with server.client() as admin:
            await admin.create(Node.model_validate({"metadata": {"name": "holder"}}))
            await admin.patch_status(Node, "holder", weights(models=[{"digest": DIGEST, "sources": [SOURCE]}]))
            # etcd silent before the index's first list: stopped, every thread of it, not only signalled
            # (a loaded machine let etcd answer that list after os.kill's SIGSTOP had returned)
            freeze(member)
            try:
                with pytest.raises(Unavailable) as err:
                    await admin.nodes_with_weights(SOURCE)
                assert "index of the nodes' weights" in str(err.value)
            finally:
                member.send_signal(signal.SIGCONT)

            async def answered():
                return await names(admin, SOURCE) == ["holder"]
            await until(answered, "the index listed once etcd is back", timeout=3 * SYNC_TIMEOUT,
                        retry=(Unavailable,))
    finally:
        server.stop()
        etcd.stop()

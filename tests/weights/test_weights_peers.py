"""Peers before the origin (llmgw/weights/peers.py, llmgw/agent/peers.py): agents serve their cache
read-only over mutual TLS with their node certificates, and a pulling agent fetches from the nodes
that hold or are pulling the same weights before the origin, verifying every byte.

Real agents against a real server for the fleet and the refusals; pullers in this process, over
real mTLS sockets, for the corrupted peer (so a byte of one peer's cache can be flipped between
two pulls)."""
from __future__ import annotations

import asyncio
import hashlib
import ssl
import time
from pathlib import Path

import aiohttp
import pytest

from llmgw.agent.listener import Revoked, serve
from llmgw.agent.peers import CacheServer
from llmgw.api import Node, NodeStatus
from llmgw.api.sources import parse_source
from llmgw.pki import identity_from_pem_file
from llmgw.pki.tls import mtls_server_context, peer_client_context
from llmgw.weights.cache import Cache
from llmgw.weights.digest import FileEntry
from llmgw.weights.peers import Peers
from llmgw.weights.puller import Puller
from llmgw.weights.resolve import HubConfig
from tests.agent.test_agent_e2e import agents, shard_in, sim_shard, wait_for  # noqa: F401
from tests.fixtures.cluster import shared_api_server  # noqa: F401
from tests.fixtures.weights_origin import WeightsOrigin, content_digest, generated, origin, sha256  # noqa: F401
from tests.weights.test_weights_pull import pull

FILES = {"config.json": 500, **{f"model-{i:05}.safetensors": 400_000 for i in range(1, 9)}}


def peer_context(server, identity: tuple[str, str]) -> ssl.SSLContext:
    ctx = ssl.create_default_context(cafile=server.ca)
    ctx.check_hostname = False
    ctx.load_cert_chain(*identity)
    return ctx


async def test_three_nodes_fetch_each_byte_from_the_origin_about_once(shared_api_server, agents, origin):
    files = generated(31, FILES)
    origin.add_repo("org/fleet", files)
    origin.rate = 4e6      # a file takes 0.1 s from the origin: longer than a status write and a read
    total, largest = sum(map(len, files.values())), max(map(len, files.values()))
    names = ["peer-1", "peer-2", "peer-3"]
    procs = [agents(n, "--hub-endpoint", origin.url, "--logs-listen", "127.0.0.1:0") for n in names]
    async with shared_api_server.client() as c:
        for name, agent in zip(names, procs, strict=True):
            async def serving(name=name):
                node = await c.get(Node, name)
                return node.status.agentEndpoint if node.status.weights is not None else None
            await wait_for(f"{name} registered with its listener", serving, agent)
        # One model on three nodes at once, as a scheduler places a replica of three.
        for name in names:
            await c.create(sim_shard(f"{name}-a", name, source="hf://org/fleet"))
        for name, agent in zip(names, procs, strict=True):
            shard = await shard_in(c, f"{name}-a", agent, "Ready", "Failed")
            assert shard.status.phase == "Ready", (shard.status, agent.tail())
        digest = content_digest(files)
        for agent in procs:
            model = agent.state_dir / "weights" / "models" / digest.removeprefix("sha256:")
            assert {p: (model / p).read_bytes() for p in files} == files
        # The origin sent the model about once: the peers sent the rest. Nodes that start within a
        # status write of each other may each fetch their first file from the origin, no more.
        assert total <= origin.bytes_sent <= total + (len(names) - 1) * largest, (origin.bytes_sent, total)
        assert not any("weights from peer" in a.log.read_text() for a in procs)     # no peer failed

        # A node may read a peer's cache, never write it: there is no route that writes.
        first = await c.get(Node, "peer-1")
        endpoint = first.status.agentEndpoint
        assert endpoint is not None
        path = f"{endpoint}/weights/models/{digest.removeprefix('sha256:')}/model-00001.safetensors"
        cached = procs[0].state_dir / "weights" / "models" / digest.removeprefix("sha256:") / "model-00001.safetensors"
        node = peer_context(shared_api_server, shared_api_server.issue_node("peer-2"))
        admin = peer_context(shared_api_server, shared_api_server.admin)
        async with aiohttp.ClientSession() as http:
            async with http.get(path, ssl=node) as r:
                assert r.status == 200 and await r.read() == files["model-00001.safetensors"]
            async with http.get(path, ssl=node, headers={"Range": "bytes=399990-"}) as r:
                assert r.status == 206 and await r.read() == files["model-00001.safetensors"][399990:]
            for method in ("PUT", "POST", "DELETE", "PATCH"):
                for url in (path, f"{endpoint}/weights/files/sha256-{'0' * 64}?size=1",
                            f"{endpoint}/weights/models/{'0' * 64}/new.bin"):
                    async with http.request(method, url, ssl=node, data=b"x" * 100) as r:
                        assert r.status == 405, (method, url, r.status)
            async with http.get(path, ssl=admin) as r:      # another role: not a node
                assert r.status == 403 and "only nodes" in await r.text()
            async with http.get(f"{endpoint}/shards/peer-1-a/log", ssl=node) as r:   # logs stay the server's
                assert r.status == 403
            async with http.get(f"{endpoint}/weights/models/{digest.removeprefix('sha256:')}/../../partial/x",
                                ssl=node) as r:
                assert r.status in (400, 404)
        assert hashlib.sha256(cached.read_bytes()).hexdigest() == sha256(files["model-00001.safetensors"])
        assert sorted(p.name for p in cached.parent.iterdir()) == sorted(files)


async def listening(agent, client) -> str:
    """The URL of a file no cache holds on `agent`'s listener, once its node registered it."""
    async def serving():
        return (await client.get(Node, agent.node)).status.agentEndpoint
    endpoint = await wait_for(f"{agent.node} registered with its listener", serving, agent)
    return f"{endpoint}/weights/models/{'0' * 64}/config.json"


async def test_a_node_certificate_revoked_is_refused_by_the_peers_within_seconds(shared_api_server, agents):
    """An agent's listener watches the server's revocation list: a node certificate revoked while
    it reads a peer's cache is refused there (401) within 5 s, and another node's still is not."""
    agent = agents("revoke-peer", "--logs-listen", "127.0.0.1:0")
    async with shared_api_server.client() as c:
        url = await listening(agent, c)
        revoked_cert = shared_api_server.issue_node("revoke-puller")
        other = peer_context(shared_api_server, shared_api_server.issue_node("revoke-other"))
        puller = peer_context(shared_api_server, revoked_cert)
        async with aiohttp.ClientSession() as http:
            async def status(ctx):
                async with http.get(url, ssl=ctx) as r:
                    return r.status
            assert await status(puller) == 404       # a node's read: not in this cache
            await c.revoke(identity_from_pem_file(revoked_cert[0]).serial)
            revoked_at = time.monotonic()
            while await status(puller) != 401:
                assert time.monotonic() - revoked_at < 5, "the peer still serves a revoked certificate"
                await asyncio.sleep(0.05)
            assert await status(other) == 404
    assert "the certificate is revoked" in agent.log.read_text()


def partial_bytes(agent) -> int:
    """What the agent's pulls in flight have written so far."""
    partial = agent.state_dir / "weights" / "partial"
    return sum(p.stat().st_size for p in partial.iterdir()) if partial.is_dir() else 0


async def test_a_node_revoked_while_it_pulls_from_a_peer_is_cut_off_by_that_peer_within_seconds(
        shared_api_server, agents, origin):
    """A real pull in progress: `pull-b` streams a file from `pull-a`, which is itself pulling it
    from a slow origin (the chain of a fleet pulling at once). `pull-b`'s certificate is revoked:
    `pull-a` ends that stream short within 5 s (not only the next request), and says why."""
    files = generated(51, {"config.json": 500, "model-00001.safetensors": 4_000_000})
    origin.add_repo("org/cut", files)
    origin.rate = 1e6          # the large file takes 4 s from the origin
    a = agents("pull-a", "--hub-endpoint", origin.url, "--logs-listen", "127.0.0.1:0")
    b = agents("pull-b", "--hub-endpoint", origin.url, "--logs-listen", "127.0.0.1:0")
    async with shared_api_server.client() as c:
        for agent in (a, b):
            await listening(agent, c)
        await c.create(sim_shard("cut-a", "pull-a", source="hf://org/cut"))
        await wait_for("pull-a to start its pull", lambda: partial_bytes(a) > 0, a)
        await c.create(sim_shard("cut-b", "pull-b", source="hf://org/cut"))   # started after: it reads pull-a
        await wait_for("pull-b to stream from pull-a", lambda: partial_bytes(b) > 1000, b)
        large = [x for x in origin.log if x.method == "GET" and x.path.endswith("model-00001.safetensors")]
        assert len(large) == 1, large      # pull-a's read alone: pull-b's bytes are pull-a's stream
        await c.revoke(identity_from_pem_file(b.argv[b.argv.index("--cert") + 1]).serial)
        revoked_at = time.monotonic()
        while "its certificate is revoked" not in a.log.read_text():
            assert time.monotonic() - revoked_at < 5, "the peer still streams to a revoked certificate"
            await asyncio.sleep(0.05)


async def test_a_listener_whose_server_refuses_its_revocation_watch_fails_closed(shared_api_server, agents):
    """The server ends and then refuses the revocation watch of an agent whose own certificate is
    revoked: that agent can no longer tell a revoked certificate, so its listener answers every
    request 503, naming why, instead of serving from a list it cannot keep."""
    agent = agents("refused-watch", "--logs-listen", "127.0.0.1:0")
    async with shared_api_server.client() as c:
        url = await listening(agent, c)
        other = peer_context(shared_api_server, shared_api_server.issue_node("refused-other"))
        async with aiohttp.ClientSession() as http:
            async def refused():
                async with http.get(url, ssl=other) as r:
                    return await r.text() if r.status == 503 else None
            assert await refused() is None           # served (a 404: not in this cache)
            await c.revoke(identity_from_pem_file(agent.argv[agent.argv.index("--cert") + 1]).serial)
            text = await wait_for("the listener to fail closed", refused, agent)
    assert "refuses its watch of revocations" in text and "revoked" in text
    assert "the listener answers every request 503" in agent.log.read_text()


# ----------------------------------------------------- pullers in this process, over real mTLS

class Fleet:
    """Pullers of named nodes, each with its cache served on a real TLS listener, and each finding
    the others through the Nodes their status makes (as the agent's client lists them)."""

    def __init__(self, server, origin: WeightsOrigin, root: Path) -> None:
        self.server, self.origin, self.root = server, origin, root
        self.pullers: dict[str, Puller] = {}
        self.endpoints: dict[str, str] = {}
        self.runners: list = []

    async def node(self, name: str) -> Puller:
        cert, key = self.server.issue_node(name)
        cache = Cache(self.root / name)
        cache.open()

        async def nodes(source: str, digest: str | None) -> list[Node]:
            # every Node (the server's index would give those naming source or digest; choose filters)
            return [Node.model_validate({"metadata": {"name": n}, "status": NodeStatus(
                agentEndpoint=self.endpoints[n], weights=p.status()).model_dump(mode="json")})
                for n, p in self.pullers.items()]
        puller = Puller(cache, HubConfig(endpoint=self.origin.url),
                        peers=Peers(name, set, nodes, peer_client_context(cert, key, self.server.ca)))
        runner, port = await serve({"/weights": CacheServer(puller).app()}, "127.0.0.1", 0,
                                   mtls_server_context(cert, key, self.server.ca), Revoked())
        self.runners.append(runner)
        self.pullers[name] = puller
        self.endpoints[name] = f"https://127.0.0.1:{port}"
        return puller

    async def close(self) -> None:
        for p in self.pullers.values():
            await p.close()
        for r in self.runners:
            await r.cleanup()


@pytest.fixture
async def fleet(shared_api_server, origin, tmp_path):
    f = Fleet(shared_api_server, origin, tmp_path)
    yield f
    await f.close()


async def test_a_corrupted_byte_in_a_peers_cache_is_detected_and_fetched_elsewhere(fleet, origin):
    files = generated(32, FILES)
    url = origin.add_dir("m", files)
    a, b = await fleet.node("node-a"), await fleet.node("node-b")
    held = await pull(a, url)
    assert origin.bytes_sent == sum(map(len, files.values()))
    bad = held.path / "model-00003.safetensors"
    bad.chmod(0o644)
    with bad.open("r+b") as f:          # one byte of node-a's cache rots
        f.seek(123_456)
        byte = f.read(1)
        f.seek(123_456)
        f.write(bytes([byte[0] ^ 0x01]))
    before = len(origin.log)
    got = await pull(b, url)
    assert got.digest == held.digest
    assert {p: (got.path / p).read_bytes() for p in files} == files     # never the rotten byte
    # node-a is left at its first wrong byte: that file and the ones after it come from the origin.
    fetched = sorted(r.path.rsplit("/", 1)[1] for r in origin.log[before:] if not r.path.endswith("manifest.json"))
    assert fetched == [f"model-{i:05}.safetensors" for i in range(3, 9)], fetched
    assert b.fetched["peer"] == 500 + 2 * 400_000 and b.fetched["origin"] == 6 * 400_000


async def test_a_pull_streams_from_a_peer_pulling_the_same_source_and_survives_its_failure(fleet, origin):
    files = generated(33, FILES)
    url = origin.add_dir("s", files)
    a, b = await fleet.node("node-c"), await fleet.node("node-d")
    # node-c's fetch of one file is cut mid-body: it resumes from the origin, and node-d, streaming
    # that file from node-c as it is written, gets it whole all the same.
    origin.drop_after("s/model-00002.safetensors", 150_000)
    src = parse_source(url)
    assert src is not None
    first = a.pull(src, None)
    while not a.status().pulls:                         # node-c has published its pull
        await asyncio.sleep(0.01)
    got_b = await pull(b, url)
    got_a = await first.task
    assert got_a.digest == got_b.digest == content_digest(files)
    assert {p: (got_b.path / p).read_bytes() for p in files} == files
    assert b.fetched["origin"] == 0 and b.fetched["peer"] == sum(map(len, files.values()))
    assert a.status().pulls == [] and b.status().models[0].digest == got_b.digest


def test_peers_are_holders_on_this_nodes_fabric_first_then_earlier_pullers_latest_first():
    from datetime import datetime, timedelta, timezone

    from llmgw.weights.peers import choose
    t0 = datetime(2026, 12, 5, tzinfo=timezone.utc)
    digest, source = "sha256:" + "ab" * 32, "hf://org/m@" + "c" * 40

    def node(name, fabrics=(), models=(), pulls=()):
        return Node.model_validate({"metadata": {"name": name}, "status": {
            "agentEndpoint": f"https://{name}:1", "fabrics": [{"name": f} for f in fabrics],
            "weights": {"models": list(models), "pulls": list(pulls)}}})
    held = [{"digest": digest, "sources": [source]}]
    nodes = [
        node("me", fabrics=["ib-a"]),
        node("far", fabrics=["ib-b"], models=held),
        node("near", fabrics=["ib-a"], models=held),
        node("by-digest", models=[{"digest": digest}]),          # a manifest's source is its digest
        node("other-model", models=[{"digest": "sha256:" + "cd" * 32}]),
        node("first", pulls=[{"source": source, "startedAt": t0.isoformat()}]),
        node("second", pulls=[{"source": source, "startedAt": (t0 + timedelta(seconds=1)).isoformat()}]),
        node("later", pulls=[{"source": source, "startedAt": (t0 + timedelta(seconds=9)).isoformat()}]),
    ]
    # A hub source (its digest not known yet): the holders that resolved it to their content, the
    # one on this node's fabric first; then the nodes that began pulling it before this one, latest
    # first (a chain); never this node, a later puller, or other content.
    peers = choose(nodes, "me", {"ib-a"}, source, None, t0 + timedelta(seconds=5))
    assert [p.node for p in peers] == ["near", "far", "second", "first"]
    assert peers[0].url(FileEntry("w/a b.bin", 1, "")) == f"https://near:1/weights/models/{'ab' * 32}/w/a%20b.bin"
    assert peers[-1].digest is None
    wanted = FileEntry("x", 7, "", sha256="ef" * 32)
    assert peers[-1].url(wanted) == f"https://first:1/weights/files/sha256-{'ef' * 32}?size=7"
    # A manifest's source is its digest: a node holding that digest serves whatever source it came from.
    peers = choose(nodes, "me", {"ib-a"}, digest, digest, t0)
    assert peers[0].node == "near" and {p.node for p in peers[1:]} == {"far", "by-digest"}

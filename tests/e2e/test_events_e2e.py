"""`llmgw events` (every kind's events, filtered, followed) and `llmgw describe` of a failed shard's
replica showing its engine log's last lines: a real `llmgw server` on etcd, real agents running sim
engines, the real `llmgw` process."""
from __future__ import annotations

import asyncio
import json
import subprocess

import pytest

from llmgw.api import Model, Node, ObjectMeta, Replica, Shard
from llmgw.api.errors import BadRequest, Expired, Forbidden, Unauthorized
from llmgw.api.wellknown import REPLICA_LABEL, shard_name
from llmgw.pki import identity_from_pem_file
from llmgw.store import Compactor, Store
from tests.agent.test_agent_e2e import LLMGW, WAIT, agents, shard_in, sim_shard  # noqa: F401
from tests.e2e.test_logs_e2e import _gone, logs_agent
from tests.fixtures.cluster import shared_api_server  # noqa: F401
from tests.fixtures.ctrlkit import replica
from tests.fixtures.poll import until


def flags(server, identity: tuple[str, str] | None = None) -> list[str]:
    cert, key = identity or server.admin
    return ["--server", server.url, "--ca", server.ca, "--cert", cert, "--key", key]


async def cli(server, *args: str, identity: tuple[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return await asyncio.to_thread(subprocess.run, [str(LLMGW), *args, *flags(server, identity)],
                                   capture_output=True, text=True, timeout=WAIT)


def rows(table: str) -> list[list[str]]:
    """A table's rows as [LAST SEEN, TYPE, REASON, OBJECT, the message's words...], header checked."""
    header, *lines = table.strip().splitlines()
    assert header.split() == ["LAST", "SEEN", "TYPE", "REASON", "OBJECT", "MESSAGE"]
    return [line.split() for line in lines]


async def test_events_of_every_kind_newest_last_by_object_and_type(shared_api_server):
    async with shared_api_server.client() as c:
        await c.record_event(Node, "ev-node", "Warning", "NodeNotReady", "heartbeat expired 40s ago")
        await c.record_event(Model, "ev-model", "Normal", "ScaledUp", "created replica ev-model-x")
        await c.record_event(Replica, "ev-model-x", "Warning", "ReplicaFailed",
                             "shard ev-model-x-0 failed\nlast lines of its log:\nout of memory")
        await c.record_event(Node, "ev-node", "Normal", "NodeReady", "heartbeat again")

    every = await cli(shared_api_server, "events")
    assert every.returncode == 0, every.stderr
    mine = [r for r in rows(every.stdout) if r[3] in ("node/ev-node", "model/ev-model", "replica/ev-model-x")]
    assert [(r[1], r[2], r[3]) for r in mine] == [
        ("Warning", "NodeNotReady", "node/ev-node"), ("Normal", "ScaledUp", "model/ev-model"),
        ("Warning", "ReplicaFailed", "replica/ev-model-x"), ("Normal", "NodeReady", "node/ev-node")]
    # a table row is one line: the first of a message and how many follow
    assert " ".join(mine[2][4:]) == "shard ev-model-x-0 failed (+2 lines: -o wide or yaml)"

    one = await cli(shared_api_server, "events", "--for", "node/ev-node")
    assert [r[2] for r in rows(one.stdout)] == ["NodeNotReady", "NodeReady"]
    warnings = await cli(shared_api_server, "events", "--for", "node/ev-node", "--type", "Warning")
    assert [r[2] for r in rows(warnings.stdout)] == ["NodeNotReady"]
    models = await cli(shared_api_server, "events", "--for", "models")
    assert {r[3].split("/")[0] for r in rows(models.stdout)} == {"model"}

    as_json = json.loads((await cli(shared_api_server, "events", "--for", "rep/ev-model-x", "-o", "json")).stdout)
    (event,) = as_json["items"]
    assert {k: event[k] for k in ("kind", "name", "type", "reason")} == {
        "kind": "replicas", "name": "ev-model-x", "type": "Warning", "reason": "ReplicaFailed"}
    assert event["message"].endswith("\nout of memory")
    wide = await cli(shared_api_server, "events", "--for", "replica/ev-model-x", "-o", "wide")
    assert "shard ev-model-x-0 failed | last lines of its log: | out of memory" in wide.stdout
    assert event["time"] in wide.stdout

    none = await cli(shared_api_server, "events", "--for", "model/ev-nothing")
    assert (none.returncode, none.stdout, none.stderr.strip()) == (0, "", "No events found.")
    for bad in ("pods/x", "node/"):
        refused = await cli(shared_api_server, "events", "--for", bad)
        assert refused.returncode == 2 and refused.stderr.count("\n") == 1, refused.stderr


async def test_reading_events_is_for_those_who_read_every_object(shared_api_server):
    async with shared_api_server.client() as c:
        await c.record_event(Model, "ev-authz", "Normal", "Seen", "by the controller-manager")
        with pytest.raises(BadRequest, match=r"need \?kind= too"):
            await c.request("GET", "/apis/llmgw.io/v1/events", params={"name": "ev-authz"})
        with pytest.raises(BadRequest, match="kind: unknown kind 'pods'"):
            await c.request("GET", "/apis/llmgw.io/v1/events", params={"kind": "pods"})
    async with shared_api_server.client(shared_api_server.issue_component("controller-manager")) as cm:
        items, _ = await cm.list_events(Model, "ev-authz")
        assert [e["reason"] for e in items] == ["Seen"]
    for identity, rule in ((shared_api_server.issue_component("gateway"), "gateway-read"),
                           (shared_api_server.issue_node("ev-some-node"), "rule node:")):
        async with shared_api_server.client(identity) as other:
            for kind in (None, Model):
                with pytest.raises(Forbidden, match=rule):
                    await other.list_events(kind)


async def test_watch_from_a_revision_and_events_w_sees_a_new_event(shared_api_server):
    async with shared_api_server.client() as c:
        await c.record_event(Replica, "ev-watched", "Normal", "Before", "recorded before the watch")
        await c.record_event(Model, "ev-elsewhere", "Normal", "Elsewhere", "another object's")
        _, revision = await c.list_events(Replica, "ev-watched")

        # the API: a watch after the list's revision has what is recorded next, of that object only
        watch = c.watch_events(revision + 1, Replica, "ev-watched")
        next_event = asyncio.ensure_future(anext(watch))
        await c.record_event(Model, "ev-elsewhere", "Normal", "Elsewhere", "not this watch's")
        await c.record_event(Replica, "ev-watched", "Warning", "During", "recorded while watched")
        seen = await asyncio.wait_for(next_event, WAIT)
        await watch.aclose()
        assert seen.type == "ADDED" and seen.revision > revision
        assert {k: seen.object[k] for k in ("kind", "name", "reason")} == {
            "kind": "replicas", "name": "ev-watched", "reason": "During"}

    # the CLI: what there is, then a new event as it is recorded
    proc = await asyncio.create_subprocess_exec(
        str(LLMGW), "events", "-w", "--for", "replica/ev-watched", *flags(shared_api_server),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    assert proc.stdout is not None
    try:
        printed = [await _line_with(proc.stdout, "During")]
        async with shared_api_server.client() as c:
            await c.record_event(Replica, "ev-watched", "Warning", "After", "recorded while -w runs")
        printed.append(await _line_with(proc.stdout, "After"))
    finally:
        proc.terminate()
        await proc.wait()
    assert [line.split()[1:4] for line in printed] == [
        ["Warning", "During", "replica/ev-watched"], ["Warning", "After", "replica/ev-watched"]]


async def test_an_events_watch_ends_expired_when_compacted_and_unauthorized_when_revoked(shared_api_server):
    srv = shared_api_server
    async with srv.client() as c, Store(srv.etcd) as store:
        _, revision = await c.list_events()
        for i in range(3):
            await c.record_event(Model, "ev-compacted", "Normal", "Filler", f"event {i}")
        await Compactor(store.etcd, keep=1).compact()
        with pytest.raises(Expired):
            async for _ in c.watch_events(revision, Model, "ev-compacted"):
                pass

        ident = srv.issue_admin("ev-doomed")
        async with srv.client(ident) as doomed:
            _, now = await doomed.list_events(Model)
            watch = doomed.watch_events(now + 1, Model)
            ended = asyncio.ensure_future(anext(watch))
            await c.revoke(identity_from_pem_file(ident[0]).serial)
            with pytest.raises(Unauthorized, match="was revoked"):
                await asyncio.wait_for(ended, WAIT)
    srv.wait_for_log("watch of events by certificate CN=ev-doomed")


async def _line_with(stream: asyncio.StreamReader, text: str) -> str:
    while True:
        line = (await asyncio.wait_for(stream.readline(), WAIT)).decode()
        assert line, f"the stream ended before a line with {text!r}"
        if text in line:
            return line


async def test_describe_of_a_failed_replica_shows_its_engine_logs_last_lines(shared_api_server, agents):
    agent = logs_agent(agents, "ev-1")
    rep = replica("ev-rep", "m", placement=[{"rank": 0, "node": "ev-1", "gpus": [0]}])
    name = shard_name("ev-rep", 0)
    crashing = sim_shard(name, "ev-1")
    crashing.metadata = ObjectMeta(name=name, labels={REPLICA_LABEL: "ev-rep"})
    crashing.spec.replica = "ev-rep"
    crashing.spec.args = ["--fail-after", "3"]
    async with shared_api_server.client() as c:
        await c.create(rep)
        await c.create(crashing)
        await shard_in(c, name, agent, "Failed")

    for kind in ("replica", "shard"):
        target = "ev-rep" if kind == "replica" else name
        described = await cli(shared_api_server, "describe", kind, target)
        assert described.returncode == 0, described.stderr
        lines = described.stdout.splitlines()
        at = lines.index(f"Engine log (shard {name}, last 10 lines):")
        log = lines[at + 1:lines.index("Events:")]
        assert 1 < len(log) <= 10 and "injected failure" in log[-1], described.stdout

    # who may not read logs reads the rest, and one line saying why not the log
    refused = await cli(shared_api_server, "describe", "replica", "ev-rep",
                        identity=shared_api_server.issue_component("controller-manager"))
    assert refused.returncode == 0 and "Traceback" not in refused.stderr, refused.stderr
    (why,) = [line for line in refused.stdout.splitlines() if line.startswith("Engine log")]
    assert why.startswith(f"Engine log (shard {name}): not shown: forbidden by rule logs")

    # as the replica controller leaves it: Failed, the shard deleted, the log still on the node
    async with shared_api_server.client() as c:
        await c.patch_status(Replica, "ev-rep", {"phase": "Failed",
                                                 "message": f"shard {name} on ev-1 failed: exit code 3; "
                                                            "rebuilding in 0s"})
        await c.delete(Shard, name)
        await until(lambda: _gone(c, name), "the failed shard to be gone", timeout=WAIT)
    after = (await cli(shared_api_server, "describe", "replica", "ev-rep")).stdout.splitlines()
    at = after.index(f"Engine log (shard {name}, last 10 lines):")
    assert "injected failure" in after[at + 1:after.index("Events:")][-1]


"""The audit log (issue 51): a line per write and per refusal, no secret in it, and rotation."""
from __future__ import annotations

import asyncio
import json

import pytest

from llmgw.api import Model, parse_object
from llmgw.api.secrets import hash_secret
from llmgw.client import Forbidden
from llmgw.pki import identity_from_pem_file
from llmgw.server.audit import AuditLog
from tests.fixtures.cluster import make_pki, start_api_server
from tests.fixtures.poll import until

V1 = "llmgw.io/v1"
SECRET = "llmgw_k_" + "7" * 48


def test_rotation_keeps_the_configured_files(tmp_path):
    path = tmp_path / "audit.log"
    audit = AuditLog(str(path), max_bytes=2000, backups=2)
    for i in range(300):
        audit.record({"n": i, "pad": "x" * 40})
    audit.close()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["audit.log", "audit.log.1", "audit.log.2"]
    last = [json.loads(line) for line in path.read_text().splitlines()]
    assert last[-1]["n"] == 299 and audit.dropped == 0


@pytest.fixture
def audited(tmp_path):
    from llmgw.dev.etcd import etcd_cluster
    etcd = etcd_cluster(tmp_path / "etcd", size=1).start()
    log = tmp_path / "audit.log"
    srv = start_api_server(make_pki(tmp_path / "ca"), etcd.endpoint, tmp_path, "--audit-log", str(log))
    yield srv, log
    srv.stop()
    etcd.stop()


def model(name, team="search"):
    return parse_object({"apiVersion": V1, "kind": "Model", "metadata": {"name": name, "labels": {"team": team}},
                         "spec": {"profiles": [{"engine": "sim"}]}})


async def test_a_line_per_write_and_per_refusal_and_no_secret(audited):
    srv, log = audited
    key_hash = hash_secret(SECRET, n=2)
    async with srv.client() as admin:
        await admin.create(parse_object({"apiVersion": V1, "kind": "ApiKey", "metadata": {"name": "k1"},
                                         "spec": {"owner": "team-a", "secretHash": key_hash}}))
        await admin.create(model("m-search"))
        await admin.create(model("m-ads", team="ads"))
        for name, role, who in (("b-view", "view", "vic"), ("b-edit", "edit", "eddie")):
            await admin.create(parse_object({"apiVersion": V1, "kind": "RoleBinding", "metadata": {"name": name},
                                             "spec": {"roleRef": {"name": role},
                                                      "subjects": [{"kind": "User", "name": who}]}}))
        await admin.list(Model)                                     # a read: no line

        async def indexed():
            return (await admin.can_i("create", "models", user="eddie"))["allowed"]
        await until(indexed, "the bindings to reach the server's index")
    vic, eddie = srv.issue("user", "vic"), srv.issue("user", "eddie")
    async with srv.client(vic) as c:
        await c.get(Model, "m-search")                              # a read: no line
        with pytest.raises(Forbidden):
            await c.delete(Model, "m-search")                       # a refusal
    async with srv.client(eddie) as c:
        m = await c.get(Model, "m-ads")
        m.spec.replicas = 2
        await c.update(m)                                           # a write
        with pytest.raises(Forbidden):
            await c.create(parse_object({"apiVersion": V1, "kind": "RoleBinding", "metadata": {"name": "mine"},
                                         "spec": {"roleRef": {"name": "admin"},
                                                  "subjects": [{"kind": "User", "name": "eddie"}]}}))
    admin_cn = identity_from_pem_file(srv.admin[0]).name
    expected = [(admin_cn, "create", "apikeys", "k1", 201), (admin_cn, "create", "models", "m-search", 201),
                (admin_cn, "create", "models", "m-ads", 201), (admin_cn, "create", "rolebindings", "b-view", 201),
                (admin_cn, "create", "rolebindings", "b-edit", 201),
                ("vic", "delete", "models", "m-search", 403), ("eddie", "update", "models", "m-ads", 200),
                ("eddie", "create", "rolebindings", None, 403)]

    async def written():
        lines = [json.loads(x) for x in log.read_text().splitlines()] if log.exists() else []
        return lines if len(lines) >= len(expected) else None
    lines = await until(written, "the audit lines")
    assert [(x["user"], x["verb"], x["kind"], x["name"], x["code"]) for x in lines] == expected
    assert all(x["requestId"] and x["time"] for x in lines)
    assert lines[6]["revision"] > lines[2]["revision"] > 0 and lines[5]["revision"] is None
    assert lines[5]["groups"] == [] and lines[0]["groups"] == ["llmgw:admins"]
    await asyncio.sleep(0.2)
    text = log.read_text()
    key_text = open(eddie[1]).read().splitlines()[1]
    assert SECRET not in text and key_hash not in text and key_hash.split("$")[-1] not in text and key_text not in text

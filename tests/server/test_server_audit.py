"""The audit log (issue 51): a line per write and per refusal, no secret in it, rotation, the
webhook (a real HTTP server receiving it) and the policy."""
from __future__ import annotations

import asyncio
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import click
import pytest
from prometheus_client import generate_latest

from llmgw.api import Model, parse_object
from llmgw.api.secrets import hash_secret
from llmgw.backoff import Backoff
from llmgw.client import Forbidden
from llmgw.cmd.auditflags import AuditFlags
from llmgw.pki import identity_from_pem_file
from llmgw.server.audit import AUDIT_BUFFER, AuditLog, FileBackend, WebhookBackend
from llmgw.server.metrics import ServerMetrics
from tests.fixtures.cluster import make_pki, start_api_server
from tests.fixtures.poll import until

V1 = "llmgw.io/v1"
SECRET = "llmgw_k_" + "7" * 48


def test_rotation_keeps_the_configured_files(tmp_path):
    path = tmp_path / "audit.log"
    backend = FileBackend(str(path), max_bytes=2000, backups=2, buffer=AUDIT_BUFFER)
    audit = AuditLog([backend])
    for i in range(300):
        audit.record({"n": i, "pad": "x" * 40})
    audit.close()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["audit.log", "audit.log.1", "audit.log.2"]
    last = [json.loads(line) for line in path.read_text().splitlines()]
    assert last[-1]["n"] == 299 and backend.dropped == 0


class Receiver:
    """A local HTTP server taking the webhook's POSTs: `batches` (each a list of lines);
    `hold` cleared: it keeps each POST waiting until set; `code`: what it answers."""

    def __init__(self) -> None:
        self.batches: list[list[dict]] = []
        self.arrived = threading.Event()
        self.hold = threading.Event()
        self.hold.set()
        self.code = 200
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                receiver.arrived.set()
                receiver.hold.wait()
                if receiver.code == 200:
                    receiver.batches.append([json.loads(x) for x in body.decode().splitlines()])
                self.send_response(receiver.code)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}/audit"
        threading.Thread(target=self.server.serve_forever, args=(0.05,), daemon=True).start()

    def lines(self) -> list[dict]:
        return [line for batch in self.batches for line in batch]


@pytest.fixture
def receiver():
    r = Receiver()
    yield r
    r.hold.set()
    r.server.shutdown()


def test_a_slow_webhook_never_holds_a_line_back_it_drops_and_counts(receiver):
    receiver.hold.clear()
    webhook = WebhookBackend(receiver.url, buffer=5)
    audit = AuditLog([webhook])
    metrics = ServerMetrics()
    metrics.audit(audit)
    audit.record({"n": 0})
    assert receiver.arrived.wait(10)      # the writer is stuck in its first POST
    for i in range(1, 21):                # 5 fit the buffer behind it, 15 find it full
        audit.record({"n": i})            # (and return: the webhook still holds its POST)
    assert webhook.dropped == 15
    assert 'llmgw_server_audit_dropped_lines_total{backend="webhook",reason="overflow"} 15.0' in \
        generate_latest(metrics.registry).decode()
    receiver.hold.set()
    audit.close()
    assert [x["n"] for x in receiver.lines()] == [0, 1, 2, 3, 4, 5]
    assert [len(b) for b in receiver.batches] == [1, 5]   # what was buffered went in one POST


def test_a_refusing_webhook_drops_the_batch_counted(receiver):
    receiver.code = 500
    webhook = WebhookBackend(receiver.url, buffer=5, retry=Backoff(0.01, 0.01))
    audit = AuditLog([webhook])
    audit.record({"n": 0})
    audit.close()
    assert webhook.failed == 1 and webhook.dropped == 0 and receiver.batches == []


def test_a_dead_webhook_does_not_hold_the_stop(receiver, caplog):
    receiver.hold.clear()                 # it never answers (until the test ends)
    audit = AuditLog([WebhookBackend(receiver.url, buffer=5, close_wait=0.3)])
    for i in range(4):
        audit.record({"n": i})
    assert receiver.arrived.wait(10)
    audit.close()                         # returns: the webhook is given close_wait, not forever
    assert "not sent (it did not answer within" in caplog.text


@pytest.mark.parametrize("text, error", [
    ("rules:\n- level: Everything\n", "rules[0].level: Input should be 'None' or 'Metadata'"),
    ("rules:\n- level: None\n  kinds: [modles]\n", "rules[0].kinds[0]: unknown kind 'modles'"),
    ("rules:\n- level: None\n  verb: [create]\n", "rules[0]: unknown field 'verb'"),
    ("rules: [\n", "not YAML"),
    ("- level: None\n", "expected a mapping with rules: [...]"),
])
def test_a_bad_policy_is_one_line_naming_the_file(tmp_path, text, error):
    policy = tmp_path / "policy.yaml"
    policy.write_text(text)
    with pytest.raises(click.ClickException) as err:
        AuditFlags(str(tmp_path / "audit.log"), policy=str(policy)).open()
    assert err.value.message.startswith(f"--audit-policy {policy}: {error}")
    assert "\n" not in err.value.message and not (tmp_path / "audit.log").exists()


# events are not audited, nor vic's refused updates; the rest is
POLICY = """
rules:
- level: None
  kinds: [events]
- level: None
  users: [vic]
  verbs: [update]
- level: Metadata
"""


@pytest.fixture
def audited(tmp_path, receiver):
    from llmgw.dev.etcd import etcd_cluster
    etcd = etcd_cluster(tmp_path / "etcd", size=1).start()
    log = tmp_path / "audit.log"
    policy = tmp_path / "policy.yaml"
    policy.write_text(POLICY)
    srv = start_api_server(make_pki(tmp_path / "ca"), etcd.endpoint, tmp_path, "--audit-log", str(log),
                           "--audit-webhook", receiver.url, "--audit-policy", str(policy))
    yield srv, log, receiver
    srv.stop()
    etcd.stop()


def model(name, team="search"):
    return parse_object({"apiVersion": V1, "kind": "Model", "metadata": {"name": name, "labels": {"team": team}},
                         "spec": {"profiles": [{"engine": "sim"}]}})


async def test_a_line_per_write_and_per_refusal_and_no_secret(audited):
    srv, log, receiver = audited
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
        await admin.record_event(Model, "m-search", "Normal", "Tested", "x")   # the policy's None: no line

        async def indexed():
            return (await admin.can_i("create", "models", user="eddie"))["allowed"]
        await until(indexed, "the bindings to reach the server's index")
    vic, eddie = srv.issue("user", "vic"), srv.issue("user", "eddie")
    async with srv.client(vic) as c:
        await c.get(Model, "m-search")                              # a read: no line
        m = await c.get(Model, "m-search")
        m.spec.replicas = 3
        with pytest.raises(Forbidden):
            await c.update(m)                                       # a refusal the policy drops
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
    sent = await until(lambda: receiver.lines() if len(receiver.lines()) >= len(lines) else None,
                       "the webhook's lines")
    assert sent == lines

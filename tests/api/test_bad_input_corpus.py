"""The bad-input corpus (tests/fixtures/data/corpus/): every case is refused with its exact exit code or
HTTP status and message, writes nothing to etcd (the /llmgw/ keys are compared before and after),
and leaves no traceback in the CLI's output or the server's log.

manifests/: files given to `llmgw apply -f`; rest/: bodies sent to the REST API as they are.
Cases too big to keep in the repository (a 10 MiB manifest) are made here.
"""
from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import aiohttp
import pytest
import yaml

from llmgw.api.limits import MAX_DEPTH
from tests.fixtures.cluster import admin_cli_config, llmgw, shared_api_server  # noqa: F401
from tests.fixtures.gateway import model as gateway_model
from tests.fixtures.gateway import running_gateway

CORPUS = Path(__file__).resolve().parents[1] / "fixtures" / "data" / "corpus"
LIMIT = "a name or alias is served by one Model only"

# case -> its problems, the same from `llmgw apply -f manifests/<case>.yaml` (exit 2, a line each,
# after "<file>: document 0: ") and from POST /models of rest/<case>.json (422, joined by "; ").
SCHEMA = {
    "replicas-huge": ["spec.replicas: Input should be less than or equal to 10000"],
    "gpus-huge": ["spec.profiles[0].nodes: Input should be less than or equal to 1024",
                  "spec.profiles[0].gpusPerNode: Input should be less than or equal to 64"],
    "replicas-string": ['spec.replicas: Input should be a valid integer, got string "3"'],
    "replicas-bool": ["spec.replicas: Input should be a valid integer, got boolean true"],
    "replicas-float": ["spec.replicas: Input should be a valid integer, got number 2.0"],
    "env-names": [f"spec.profiles[0].env.{k}: '{k}' is not an environment variable name (a letter or '_', "
                  "then letters, digits or '_')" for k in ("A=B", "1X")],
    "label-key": ["metadata.labels.a b,c=d: 'a b,c=d' is not a valid label key (an optional DNS subdomain and "
                  "'/', then at most 63 letters, digits, '-', '_' or '.', starting and ending with a letter or "
                  "digit)"],
    "autoscaling-bounds": ["spec.autoscaling.minReplicas: Input should be greater than or equal to 0",
                           "spec.autoscaling.maxReplicas: Input should be greater than or equal to 1",
                           "spec.autoscaling.targetInFlight: Input should be greater than or equal to 1",
                           "spec.autoscaling.scaleDownStabilizationSeconds: Input should be less than or equal to "
                           "86400",
                           'spec.autoscaling.scaleToZeroDelaySeconds: Input should be a valid integer, got string '
                           '"60"'],
    "autoscaling-min-over-max": ["spec.autoscaling: maxReplicas (2) is below minReplicas (3)"],
    "source-flag": ["spec.source: '--trust-remote-code' starts with '-': the engine would read it as a flag"],
}
TAKEN = f"Model 'corpus-thief': the alias 'corpus-small' is the name of Model 'corpus-small'; {LIMIT}"

# file -> (exit code, stderr after "error: "; {f} is the file's path). Exit 2: invalid manifest,
# nothing sent; exit 5: the server refused it (409).
MANIFESTS = {
    "empty.yaml": (2, "{f}: document 0: <document>: no objects in this file (it is empty or holds only comments)"),
    "comments.yaml": (2, "{f}: document 0: <document>: no objects in this file (it is empty or holds only "
                         "comments)"),
    "binary.yaml": (2, "{f}: document 0: <document>: not UTF-8 text (byte 0x80 at offset 128); write "
                       "YAML or JSON in UTF-8"),
    "latin1.yaml": (2, "{f}: document 0: <document>: not UTF-8 text (byte 0xe9 at offset 72); write "
                       "YAML or JSON in UTF-8"),
    "deep.yaml": (2, f"{{f}}: document 0: <document>: nested deeper than {MAX_DEPTH} levels"),
    "duplicate-key.yaml": (2, "{f}: document 0: spec.replicas: duplicate key (line 9)"),
    "duplicate-key.json": (2, "{f}: document 0: spec.profiles[0].nodes: duplicate key (line 2)"),
    "alias-own-name.yaml": (2, "{f}: document 0: <document>: spec.aliases[0]: 'corpus-self' is already a name of "
                               "this Model"),
    "alias-taken.yaml": (5, TAKEN),
    "name-taken.yaml": (5, f"Model 'corpus-large': its name 'corpus-large' is an alias of Model 'corpus-big'; "
                           f"{LIMIT}"),
    **{f"{case}.yaml": (2, "\n".join("{f}: document 0: " + p for p in problems)) for case, problems in SCHEMA.items()},
}

# (file, method, path, identity, status, reason, message)
REST = [
    ("deep.json", "POST", "/models", "admin", 400, "BadRequest",
     f"request body: <document>: nested deeper than {MAX_DEPTH} levels"),
    # authorized by the URL before the body is read: an identity that may not use the URL is
    # refused (403) whatever it sent
    ("deep.json", "POST", "/models", "node", 403, "Forbidden",
     "forbidden by rule node-shard-refs: node corpus-node may only get the models and replicas of its shards; "
     "it asked to create models"),
    ("deep.json", "POST", "/models", "gateway", 403, "Forbidden",
     "forbidden by rule gateway-read: the gateway may only get, list and watch models, replicas, nodes, apikeys "
     "and adapters; it asked to create models"),
    ("replicas-huge.json", "POST", "/models", "node", 403, "Forbidden",
     "forbidden by rule node-shard-refs: node corpus-node may only get the models and replicas of its shards; "
     "it asked to create models"),
    ("deep.json", "PATCH", "/nodes/corpus-other/status", "node", 403, "Forbidden",
     "forbidden by rule node-self: certificate CN=corpus-node may read and write a Node only as node "
     "corpus-node, not corpus-other"),
    ("node-no-status.json", "PUT", "/nodes/corpus-node/status", "admin", 422, "Invalid",
     "status: Field required (this request writes it)"),
    ("empty-object.json", "POST", "/heartbeat/corpus-ghost", "admin", 404, "NotFound",
     "nodes/corpus-ghost not found"),
    ("event-node-mapping.json", "POST", "/events", "admin", 422, "Invalid", "node: must be a string"),
    ("deep-65.json", "POST", "/models", "admin", 400, "BadRequest",
     f"request body: spec.x{'[0]' * (MAX_DEPTH - 2)}: nested deeper than {MAX_DEPTH} levels"),
    ("deep.json", "PATCH", "/models/corpus-small/status", "node", 403, "Forbidden",
     "forbidden by rule node-shard-refs: node corpus-node may only get the models and replicas of its shards; "
     "it asked to status models/corpus-small"),
    ("duplicate-key.json", "POST", "/models", "admin", 400, "BadRequest", "request body: metadata.name: duplicate key"),
    ("not-json.json", "POST", "/models", "admin", 400, "BadRequest",
     "request body is not valid JSON: Expecting property name enclosed in double quotes: line 1 column 31 "
     "(char 30)"),
    ("not-utf8.json", "POST", "/models", "admin", 400, "BadRequest", "request body is not valid JSON (not UTF-8)"),
    ("alias-taken.json", "POST", "/models", "admin", 409, "NameTaken", TAKEN),
    ("alias-taken.json", "POST", "/models/corpus-thief/apply", "admin", 409, "NameTaken", TAKEN),
    ("status-conditions.json", "PATCH", "/models/corpus-small/status", "admin", 422, "Invalid",
     "status.conditions: Input should be a valid list, got integer 5"),
    ("heartbeat-ttl-bool.json", "POST", "/heartbeat/corpus-node", "node", 400, "BadRequest",
     "ttl must be an integer number of seconds in 1..600, got True"),
    *((f"{case}.json", "POST", "/models", "admin", 422, "Invalid", "; ".join(problems))
      for case, problems in SCHEMA.items()),
]


def model_doc(name: str, *aliases: str, labels: dict | None = None) -> dict:
    return {"apiVersion": "llmgw.io/v1", "kind": "Model", "metadata": {"name": name, "labels": labels or {}},
            "spec": {"aliases": list(aliases), "profiles": [{"engine": "sim"}]}}


def etcd_keys(server) -> dict[str, tuple[str, int]]:
    """Every key under /llmgw/ with its value and mod_revision, read by etcdctl."""
    done = subprocess.run(["etcdctl", f"--endpoints={server.etcd}", "get", "/llmgw/", "--prefix", "-w", "json"],
                          capture_output=True, text=True, check=True, env={**os.environ, "ETCDCTL_API": "3"})
    return {kv["key"]: (kv.get("value", ""), kv["mod_revision"]) for kv in json.loads(done.stdout).get("kvs", [])}


@pytest.fixture(scope="module")
def seeded(shared_api_server, config, tmp_path_factory):
    """Models the cases collide with: corpus-small, and corpus-big with the alias corpus-large."""
    f = tmp_path_factory.mktemp("seed") / "seed.yaml"
    f.write_text(yaml.safe_dump_all([model_doc("corpus-small", labels={"set": "corpus"}),
                                     model_doc("corpus-big", "corpus-large", labels={"set": "corpus"})]))
    out = llmgw(config, "apply", "-f", str(f))
    assert out.exit_code == 0, out.output
    return shared_api_server


def test_a_valid_manifest_is_a_control(seeded, config, tmp_path):
    """The same path as the corpus, with a manifest that is fine: it does write."""
    f = tmp_path / "ok.yaml"
    f.write_text(yaml.safe_dump(model_doc("corpus-ok", "corpus-ok-alias")))
    before = etcd_keys(seeded)
    out = llmgw(config, "apply", "-f", str(f))
    assert (out.exit_code, out.stdout) == (0, "model/corpus-ok created\n")
    assert etcd_keys(seeded) != before


@pytest.mark.parametrize("name", sorted(MANIFESTS))
def test_manifest_corpus(seeded, config, name):
    code, message = MANIFESTS[name]
    path = CORPUS / "manifests" / name
    before = etcd_keys(seeded)
    out = llmgw(config, "apply", "-f", str(path))
    assert (out.exit_code, out.stdout) == (code, "")
    assert out.stderr == "error: " + message.format(f=path) + "\n"
    assert "Traceback" not in out.output
    assert etcd_keys(seeded) == before


def test_a_manifest_over_the_size_limit_is_named_before_anything_is_sent(seeded, config, tmp_path):
    path = tmp_path / "big.yaml"
    # 10,240 documents, one's YAML with the name changed: the text safe_dump_all writes, without its
    # 10 s of CPU
    one = yaml.safe_dump(model_doc("NAME") | {"spec": {"profiles": [{"engine": "sim", "args": ["x" * 1000]}]}})
    path.write_text("---\n".join(one.replace("NAME", f"corpus-big-file-{i}") for i in range(10 * 1024)))
    before = etcd_keys(seeded)
    out = llmgw(config, "apply", "-f", str(path))
    assert out.exit_code == 2
    assert out.stderr == (f"error: {path}: document 0: <document>: file is larger than the limit of 8 MiB; "
                          "split it into several files\n")
    assert etcd_keys(seeded) == before


def test_an_object_over_the_body_limit_is_named_before_it_is_sent(seeded, config, tmp_path):
    path = tmp_path / "one-big.yaml"
    doc = model_doc("corpus-huge-args") | {"spec": {"profiles": [{"engine": "sim", "args": ["y" * (2 << 20)]}]}}
    path.write_text(yaml.safe_dump_all([model_doc("corpus-fine"), doc]))
    before = etcd_keys(seeded)
    out = llmgw(config, "apply", "-f", str(path))
    assert out.exit_code == 2
    assert out.stderr.startswith(f"error: {path}: document 1: <document>: Model 'corpus-huge-args' is ")
    assert out.stderr.endswith(" bytes as JSON, larger than the limit of 1 MiB for one object\n")
    assert etcd_keys(seeded) == before  # not even the fine document before it


@pytest.mark.parametrize("selector, message", [
    (" ", "--selector ' ' selects every object; --prune needs one that limits what may be deleted"),
    ("", "--selector '' selects every object; --prune needs one that limits what may be deleted"),
    (", ", "selector ', ': empty requirement"),
], ids=["space", "empty", "comma"])
def test_prune_with_a_blank_selector_deletes_nothing(seeded, config, tmp_path, selector, message):
    # it used to parse to match-all and prune every Model but the manifest's
    f = tmp_path / "one.yaml"
    f.write_text(yaml.safe_dump(model_doc("corpus-small", labels={"set": "corpus"})))
    before = etcd_keys(seeded)
    out = llmgw(config, "apply", "-f", str(f), "--prune", "-l", selector)
    assert (out.exit_code, out.stdout, out.stderr) == (2, "", f"error: {message}\n")
    assert etcd_keys(seeded) == before


# a client config (LLMGW_CONFIG) that cannot be read as one: exit 2, stderr after "error: {f}: "
CONFIGS = {
    "manifests/binary.yaml": "not UTF-8 text (byte 0x80 at offset 128); write YAML or JSON in UTF-8",
    "manifests/deep.yaml": f"nested deeper than {MAX_DEPTH} levels",
    "client-config-duplicate.yaml": "server: duplicate key (line 2)",
}


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_client_config_corpus(name):
    path = CORPUS / name
    out = llmgw(path, "get", "models")
    assert (out.exit_code, out.stdout, out.stderr) == (2, "", f"error: {path}: {CONFIGS[name]}\n")


@pytest.fixture(scope="module")
def node_identity(seeded):
    return seeded.issue_node("corpus-node")


@pytest.fixture(scope="module")
def identities(seeded, node_identity):
    return {"admin": seeded.admin, "node": node_identity, "gateway": seeded.issue_component("gateway")}


@pytest.mark.parametrize("case", REST, ids=[f"{c[0]}-{c[1]}{c[2]}-{c[3]}" for c in REST])
def test_rest_corpus(seeded, identities, case):
    name, method, path, who, status, reason, message = case
    identity = identities[who]
    before = etcd_keys(seeded)
    got_status, body = seeded.send(identity, method, path, (CORPUS / "rest" / name).read_bytes())
    assert (got_status, body.get("reason"), body.get("message")) == (status, reason, message)
    assert etcd_keys(seeded) == before


@pytest.mark.parametrize("query", ["node=../../spec", "node=corpus-node/x", "node=" + "a" * 64])
def test_a_node_parameter_that_is_not_a_name_is_a_400(seeded, query):
    status, body = seeded.send(seeded.admin, "GET", f"/shards?{query}")
    assert (status, body["reason"]) == (400, "BadRequest")
    assert body["message"].startswith("node: ") and "is not a DNS-1123 label" in body["message"]


# a merge patch is a PATCH's body only: POST and PUT take an object
@pytest.mark.parametrize("content_type", ["text/plain", "application/x-www-form-urlencoded", "application/yaml",
                                          "application/merge-patch+json"])
def test_a_body_that_is_not_json_is_a_415(seeded, content_type):
    before = etcd_keys(seeded)
    status, body = seeded.send(seeded.admin, "POST", "/models", json.dumps(model_doc("corpus-415")).encode(),
                               content_type=content_type)
    assert (status, body["reason"]) == (415, "UnsupportedMediaType")
    assert repr(content_type) in body["message"]
    assert etcd_keys(seeded) == before


def test_a_body_over_the_limit_is_a_413_in_json(seeded):
    before = etcd_keys(seeded)
    big = json.dumps(model_doc("corpus-413") | {"x": "z" * (1 << 20)}).encode()
    status, body = seeded.send(seeded.admin, "POST", "/models", big)
    assert (status, body["reason"], body["message"]) == (
        413, "RequestEntityTooLarge", "request body: larger than the limit of 1 MiB")
    assert etcd_keys(seeded) == before


async def test_the_gateway_refuses_deep_json_with_the_same_message():
    from tests.gateway.test_gateway_proxy import llama_table, openai_error

    t = llama_table("127.0.0.1:9")
    t.apply("models", "ADDED", gateway_model("mistral"))
    async with running_gateway(t) as gw, aiohttp.ClientSession() as s:
        for raw, where in ((CORPUS / "rest" / "deep.json").read_bytes(), "<document>"), \
                          (b'{"model": "llama", "x": ' + b"[" * 70 + b"]" * 70 + b"}", "x" + "[0]" * 63):
            async with s.post(gw.url + "/v1/chat/completions", data=raw) as r:
                assert r.status == 400
                assert openai_error(await r.read())["message"] == (
                    f"We could not parse the JSON body of your request ({where}: nested deeper than "
                    f"{MAX_DEPTH} levels); send a JSON object with 'Content-Type: application/json'")


def test_no_traceback_in_the_server_log(seeded):
    """Last in this module: the corpus above left no traceback in the server's log."""
    log = "\n".join(seeded.log_lines())
    assert "Traceback" not in log, log[-3000:]

"""API validation messages, multi-document loading, CRD schemas and the examples."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import jsonschema
import pytest
import yaml

from llmgw.api import InvalidObject, ManifestError, load_file, load_path, parse_object, parse_stored, resolve_kind

ROOT = Path(__file__).resolve().parents[2]


def model_doc(**spec_overrides) -> dict:
    spec = {"replicas": 1, "profiles": [{"engine": "sim"}]}
    spec.update(spec_overrides)
    return {"apiVersion": "llmgw.io/v1", "kind": "Model", "metadata": {"name": "m1"}, "spec": spec}


def problems(doc) -> list[str]:
    with pytest.raises(InvalidObject) as info:
        parse_object(doc)
    return info.value.problems


@pytest.mark.parametrize("profile, expected", [
    ({"engine": "vllm", "gpus_per_node": 8}, "spec.profiles[0]: unknown field 'gpus_per_node'"),
    ({"engine": "tgi"}, "spec.profiles[0].engine: unknown engine 'tgi': one of llamacpp, sglang, sim, vllm"),
    ({"engine": "sglang", "launchMode": "ray"}, "spec.profiles[0]: launchMode is only for engine vllm, not sglang"),
    ({"engine": "llamacpp", "nodes": 2}, "spec.profiles[0]: engine llamacpp is single-node: nodes must be 1"),
    ({"engine": "vllm", "nodes": 0}, "spec.profiles[0].nodes: Input should be greater than or equal to 1"),
    ({"engine": "vllm", "gpusPerNode": 0}, "spec.profiles[0].gpusPerNode: Input should be greater than or equal to 1"),
    ({"engine": "vllm", "args": ["--tensor-parallel-size=4"]},
     "spec.profiles[0]: args may not set --tensor-parallel-size: "
     "llmgw derives parallel sizes from the profile's nodes and gpusPerNode"),
    ({"engine": "vllm", "args": ["--port", "9000"]},
     "spec.profiles[0]: args may not set --port: llmgw assigns the serve port from the node's port range"),
    ({"engine": "sglang", "args": ["--dist-init-addr", "x:1"]},
     "spec.profiles[0]: args may not set --dist-init-addr: "
     "llmgw sets the multi-node rendezvous from the replica's placement"),
    ({"engine": "llamacpp", "args": ["--alias", "x"]},
     "spec.profiles[0]: args may not set --alias: "
     "llmgw passes the model's name and aliases so the gateway can route by them"),
])
def test_profile_rules(profile, expected):
    assert expected in problems(model_doc(profiles=[profile]))


def test_names_and_counts():
    doc = model_doc(replicas=-1)
    doc["metadata"]["name"] = "Llama_3"
    got = problems(doc)
    assert any(p.startswith("metadata.name: 'Llama_3' is not a DNS-1123 label") for p in got)
    assert "spec.replicas: Input should be greater than or equal to 0" in got


def test_unknown_top_level_field_and_kind():
    doc = model_doc()
    doc["spce"] = {}
    assert "<document>: unknown field 'spce'" in problems(doc)
    found = problems({"apiVersion": "llmgw.io/v1", "kind": "Deployment"})
    assert found[0].startswith("kind: unknown kind 'Deployment'")


def test_multi_document_file_loads_nothing_when_any_document_is_bad(tmp_path):
    good = model_doc()
    bad1 = model_doc(profiles=[{"engine": "vllm", "gpus_per_node": 8}])
    bad1["metadata"]["name"] = "m2"
    bad2 = model_doc(replicas="three")
    f = tmp_path / "models.yaml"
    f.write_text(yaml.safe_dump_all([good, bad1, bad2]))
    with pytest.raises(ManifestError) as info:
        load_file(f)
    text = str(info.value)
    assert f"{f}: document 1: spec.profiles[0]: unknown field 'gpus_per_node'" in text
    assert f"{f}: document 2: spec.replicas: Input should be a valid integer" in text
    assert [e.index for e in info.value.errors] == [1, 2]


def test_directory_with_one_bad_file_loads_nothing(tmp_path):
    (tmp_path / "a.yaml").write_text(yaml.safe_dump(model_doc()))
    (tmp_path / "b.yaml").write_text("kind: Model\napiVersion: llmgw.io/v1\nmetadata: {name: x}\n")
    with pytest.raises(ManifestError) as info:
        load_path(tmp_path)
    assert "b.yaml: document 0: spec: required field is missing" in str(info.value)


def test_invalid_yaml_names_the_line(tmp_path):
    f = tmp_path / "broken.yaml"
    f.write_text("apiVersion: llmgw.io/v1\nkind: Model\nmetadata: {name: [\n")
    with pytest.raises(ManifestError) as info:
        load_file(f)
    assert f"{f}: document 0: <document>: not valid YAML at line" in str(info.value)


def test_kind_words():
    assert ([resolve_kind(w) for w in ("no", "Node", "models", "rep", "sh")]
            == ["nodes", "nodes", "models", "replicas", "shards"])
    with pytest.raises(ValueError, match="unknown kind 'pods'"):
        resolve_kind("pods")


def test_crds_are_current():
    result = subprocess.run([sys.executable, str(ROOT / "hack" / "gen_crds.py"), "--check"],
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


EXAMPLES = sorted((ROOT / "examples").rglob("*.yaml"))
MANIFESTS = [p for p in EXAMPLES if "kind:" in p.read_text() and "apiVersion: llmgw.io/v1" in p.read_text()]


def test_examples_cover_the_documented_cases():
    names = {p.name for p in MANIFESTS}
    assert {"vllm-70b-mp.yaml", "vllm-70b-ray.yaml", "sglang-2node.yaml", "llamacpp-1gpu.yaml",
            "sim-single.yaml", "sim-2node.yaml", "fallback.yaml"} <= names


@pytest.mark.parametrize("path", MANIFESTS, ids=lambda p: str(p.relative_to(ROOT)))
def test_example_validates_against_its_schema(path):
    first = path.read_text().splitlines()[0]
    assert first.startswith("# yaml-language-server: $schema="), f"{path} lacks the schema line"
    schema_path = (path.parent / first.split("$schema=", 1)[1]).resolve()
    schema = json.loads(schema_path.read_text())
    for doc in yaml.safe_load_all(path.read_text()):
        jsonschema.validate(doc, schema)
    assert load_file(path)


def test_schema_rejects_what_the_types_reject():
    schema = json.loads((ROOT / "crds" / "model.schema.json").read_text())
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(model_doc(profiles=[{"engine": "vllm", "gpus_per_node": 8}]), schema)


def stored_docs(obj) -> tuple[bytes, bytes]:
    """The two documents the store writes for an object (llmgw/store/store.py)."""
    return (obj.model_dump_json(exclude={"status": True, "metadata": {"resourceVersion"}}).encode(),
            obj.status.model_dump_json().encode())


def test_parse_stored_reads_back_what_parse_object_reads():
    from tests.fixtures.gateway import replica
    objs = [o for path in sorted((ROOT / "examples" / "models").glob("*.yaml")) for o in load_file(path)]
    objs.append(replica("r1", "m1", "10.0.0.1:8000", served=("m1",)))
    objs.append(parse_object({
        "apiVersion": "llmgw.io/v1", "kind": "Shard", "metadata": {"name": "r1-0", "labels": {"a": "b"}},
        "spec": {"replica": "r1", "model": "m1", "node": "n1", "rank": 0, "worldSize": 2, "gpus": [0, 1],
                 "ports": {"serve": 20000, "distInit": 20001}, "headAddress": "10.0.0.1", "engine": "sim",
                 "servedModelNames": ["m1"]},
        "status": {"phase": "Running", "pid": 7, "startedAt": "2026-12-03T08:00:00Z"}}))
    assert {type(o).__name__ for o in objs} == {"Model", "Replica", "Shard"}
    for obj in objs:
        spec, status = stored_docs(obj)
        back = parse_stored(spec, status)
        assert type(back) is type(obj) and back == obj.model_copy(
            update={"metadata": obj.metadata.model_copy(update={"resourceVersion": None})})
        assert parse_stored(spec, None).status == type(obj).model_fields["status"].default_factory()


def test_parse_stored_names_the_field_of_a_bad_document():
    spec, status = stored_docs(load_file(ROOT / "examples" / "models" / "sim-single.yaml")[0])
    bad = spec.replace(b'"replicas":', b'"replicaz":', 1)
    with pytest.raises(InvalidObject) as info:
        parse_stored(bad, status)
    assert "spec: unknown field 'replicaz'" in info.value.problems
    with pytest.raises(InvalidObject, match="unknown kind 'Pod'"):
        parse_stored(spec.replace(b'"kind":"Model"', b'"kind":"Pod"'), status)

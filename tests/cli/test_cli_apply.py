"""`llmgw apply/diff/delete` end to end: the real CLI against a real server on real etcd."""
from __future__ import annotations

from pathlib import Path

import yaml

from tests.fixtures.cluster import admin_cli_config, llmgw, shared_api_server  # noqa: F401


def model_doc(name: str, replicas: int = 1, labels: dict | None = None, **spec) -> dict:
    return {"apiVersion": "llmgw.io/v1", "kind": "Model",
            "metadata": {"name": name, "labels": labels or {}},
            "spec": {"replicas": replicas, "profiles": [{"engine": "sim"}], **spec}}


def write(path: Path, *docs: dict) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump_all(docs))
    return path


def generation(config: Path, name: str) -> int:
    out = llmgw(config, "get", "model", name, "-o", "yaml")
    assert out.exit_code == 0, out.output
    return yaml.safe_load(out.stdout)["metadata"]["generation"]


def test_apply_is_idempotent_and_reports_each_object(config, tmp_path):
    f = write(tmp_path / "m.yaml", model_doc("idem-a"), model_doc("idem-b", aliases=["b2"]))
    first = llmgw(config, "apply", "-f", str(f))
    assert first.exit_code == 0, first.output
    assert first.stdout.splitlines() == ["model/idem-a created", "model/idem-b created"]
    gen = generation(config, "idem-b")

    second = llmgw(config, "apply", "-f", str(f))
    assert second.stdout.splitlines() == ["model/idem-a unchanged", "model/idem-b unchanged"]
    assert generation(config, "idem-b") == gen

    write(f, model_doc("idem-a"), model_doc("idem-b", replicas=3, aliases=["b2"]))
    third = llmgw(config, "apply", "-f", str(f))
    assert third.stdout.splitlines() == ["model/idem-a unchanged", "model/idem-b configured"]
    assert generation(config, "idem-b") == gen + 1


def test_dry_run_reports_and_writes_nothing(config, tmp_path):
    write(tmp_path / "live.yaml", model_doc("dry-a", labels={"set": "dry"}),
          model_doc("dry-gone", labels={"set": "dry"}))
    assert llmgw(config, "apply", "-f", str(tmp_path / "live.yaml")).exit_code == 0
    gen = generation(config, "dry-a")

    f = write(tmp_path / "next" / "m.yaml", model_doc("dry-a", replicas=2, labels={"set": "dry"}),
              model_doc("dry-new", labels={"set": "dry"}))
    out = llmgw(config, "apply", "-f", str(f), "--prune", "--selector", "set=dry", "--dry-run")
    assert out.exit_code == 0, out.output
    assert out.stdout.splitlines() == ["model/dry-a configured (dry run)", "model/dry-new created (dry run)",
                                       "model/dry-gone pruned (dry run)"]
    assert generation(config, "dry-a") == gen
    names = llmgw(config, "get", "models", "-l", "set=dry", "-o", "name").stdout.split()
    assert names == ["model/dry-a", "model/dry-gone"]


def test_prune_deletes_only_what_the_selector_covers(config, tmp_path):
    write(tmp_path / "all.yaml",
          model_doc("pr-keep", labels={"team": "a"}), model_doc("pr-drop", labels={"team": "a"}),
          model_doc("pr-other-team", labels={"team": "b"}), model_doc("pr-unlabelled"))
    assert llmgw(config, "apply", "-f", str(tmp_path / "all.yaml")).exit_code == 0

    d = tmp_path / "team-a"
    write(d / "keep.yaml", model_doc("pr-keep", labels={"team": "a"}))
    write(d / "sub" / "new.yaml", model_doc("pr-new", labels={"team": "a"}))
    out = llmgw(config, "apply", "-f", str(d), "-R", "--prune", "--selector", "team=a")
    assert out.exit_code == 0, out.output
    assert out.stdout.splitlines() == ["model/pr-keep unchanged", "model/pr-new created", "model/pr-drop pruned"]
    names = set(llmgw(config, "get", "models", "-o", "name").stdout.split())
    assert {"model/pr-keep", "model/pr-new", "model/pr-other-team", "model/pr-unlabelled"} <= names
    assert "model/pr-drop" not in names

    # without -R the subdirectory is not read, so pr-new is pruned: -R matters
    out = llmgw(config, "apply", "-f", str(d), "--prune", "--selector", "team=a")
    assert out.stdout.splitlines() == ["model/pr-keep unchanged", "model/pr-new pruned"]


def test_prune_needs_a_selector(config, tmp_path):
    f = write(tmp_path / "m.yaml", model_doc("pr-nosel"))
    out = llmgw(config, "apply", "-f", str(f), "--prune")
    assert out.exit_code == 2
    assert out.stderr.strip() == "error: --prune needs --selector: it limits what may be deleted"


def test_diff_exit_codes_and_output(config, tmp_path):
    f = write(tmp_path / "m.yaml", model_doc("diff-a", labels={"v": "1"}))
    new = llmgw(config, "diff", "-f", str(f))
    assert new.exit_code == 1
    assert new.stdout.splitlines()[:2] == ["--- /dev/null", "+++ manifest/model/diff-a"]

    assert llmgw(config, "apply", "-f", str(f)).exit_code == 0
    same = llmgw(config, "diff", "-f", str(f))
    assert (same.exit_code, same.stdout) == (0, "")

    write(f, model_doc("diff-a", replicas=4, labels={"v": "2"}))
    changed = llmgw(config, "diff", "-f", str(f))
    assert changed.exit_code == 1
    lines = changed.stdout.splitlines()
    assert lines[:2] == ["--- live/model/diff-a", "+++ manifest/model/diff-a"]
    assert {"-  replicas: 1", "+  replicas: 4", "-    v: '1'", "+    v: '2'"} <= set(lines)
    assert generation(config, "diff-a") == 1   # diff writes nothing


def test_invalid_manifest_names_file_document_and_field(config, tmp_path):
    bad = model_doc("bad-b")
    bad["spec"]["profiles"][0]["gpus_per_node"] = 2
    f = write(tmp_path / "bad.yaml", model_doc("bad-a"), bad)
    for verb in ("apply", "diff", "delete"):
        out = llmgw(config, verb, "-f", str(f))
        assert out.exit_code == 2, (verb, out.output)
        assert out.stderr.strip() == f"error: {f}: document 1: spec.profiles[0]: unknown field 'gpus_per_node'"
    # nothing of the file was applied
    assert llmgw(config, "get", "model", "bad-a").exit_code == 1

    missing = llmgw(config, "apply", "-f", str(tmp_path / "nope.yaml"))
    assert missing.exit_code == 2 and "nope.yaml: no such file or directory" in missing.stderr


def test_stale_resource_version_is_a_conflict(config, tmp_path):
    f = write(tmp_path / "m.yaml", model_doc("conf-a"))
    assert llmgw(config, "apply", "-f", str(f)).exit_code == 0
    edited = yaml.safe_load(llmgw(config, "get", "model", "conf-a", "-o", "yaml").stdout)
    # someone else changes the model after we read it
    write(f, model_doc("conf-a", replicas=2))
    assert llmgw(config, "apply", "-f", str(f)).stdout.strip() == "model/conf-a configured"

    edited["spec"]["replicas"] = 5
    out = llmgw(config, "apply", "-f", str(write(tmp_path / "edited.yaml", edited)))
    assert out.exit_code == 5
    assert out.stderr.startswith("error: conflict: models/conf-a changed since it was read")
    assert out.stderr.rstrip().endswith("re-run the command to work on the current version")
    assert len(out.stderr.strip().splitlines()) == 1
    assert yaml.safe_load(llmgw(config, "get", "model", "conf-a", "-o", "json").stdout)["spec"]["replicas"] == 2

    # the same edit on the current version goes through
    current = yaml.safe_load(llmgw(config, "get", "model", "conf-a", "-o", "yaml").stdout)
    current["spec"]["replicas"] = 5
    out = llmgw(config, "apply", "-f", str(write(tmp_path / "edited.yaml", current)))
    assert out.stdout.strip() == "model/conf-a configured"


def test_delete_by_name_and_by_file(config, tmp_path):
    f = write(tmp_path / "m.yaml", model_doc("del-a"), model_doc("del-b"))
    assert llmgw(config, "apply", "-f", str(f)).exit_code == 0
    out = llmgw(config, "delete", "mo", "del-a")
    assert (out.exit_code, out.stdout.strip()) == (0, "model/del-a deleted")
    again = llmgw(config, "delete", "model", "del-a")
    assert again.exit_code == 1 and again.stderr.startswith("error: ") and "del-a" in again.stderr
    out = llmgw(config, "delete", "-f", str(f), "--ignore-not-found")
    assert (out.exit_code, out.stdout.strip()) == (0, "model/del-b deleted")
    bad_kind = llmgw(config, "delete", "pods", "x")
    assert bad_kind.exit_code == 2 and "unknown kind 'pods'" in bad_kind.stderr


AUTOSCALING = {"minReplicas": 0, "maxReplicas": 4, "targetInFlight": 2}


def test_reapplying_an_autoscaled_model_while_scaled_changes_nothing(config, tmp_path, shared_api_server):
    """The autoscaler's count lives in status.desiredReplicas: apply owns spec, so re-applying
    the GitOps manifest neither resets the count nor shows it as drift."""
    import asyncio

    f = write(tmp_path / "m.yaml", model_doc("scaled-a", autoscaling=AUTOSCALING))
    assert llmgw(config, "apply", "-f", str(f)).exit_code == 0

    async def scale() -> None:   # what the autoscaler writes
        async with shared_api_server.client() as client:
            from llmgw.api import Model
            await client.patch_status(Model, "scaled-a", {"desiredReplicas": 3})
    asyncio.run(scale())

    again = llmgw(config, "apply", "-f", str(f))
    assert again.exit_code == 0 and "unchanged" in again.output, again.output
    same = llmgw(config, "diff", "-f", str(f))
    assert (same.exit_code, same.stdout) == (0, "")
    live = yaml.safe_load(llmgw(config, "get", "model", "scaled-a", "-o", "yaml").stdout)
    assert live["status"]["desiredReplicas"] == 3 and live["metadata"]["generation"] == 1

"""`llmgw get/describe/reconcile/suspend/resume gitsource` and a hand `llmgw apply` of an object a GitSource
applied: the real CLI against a real server on real etcd (the controller is
tests/controllers/test_controller_gitops.py's)."""
from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import yaml

from llmgw.api import GitSource, Model, parse_object
from llmgw.api.wellknown import GITSOURCE_LABEL, RECONCILE_REQUESTED_AT
from llmgw.cli import errors as ec
from tests.fixtures.cluster import admin_cli_config, llmgw, shared_api_server  # noqa: F401

REV = "0123456789abcdef0123456789abcdef01234567"


def model_doc(name: str, replicas: int = 1, labels: dict[str, str] | None = None) -> dict[str, Any]:
    return {"apiVersion": "llmgw.io/v1", "kind": "Model", "metadata": {"name": name, "labels": labels or {}},
            "spec": {"replicas": replicas, "profiles": [{"engine": "sim"}]}}


def run(server: Any, coro_fn: Any) -> Any:
    async def go() -> Any:
        async with server.client() as c:
            return await coro_fn(c)
    return asyncio.run(go())


def seed_source(server: Any, name: str, status: dict[str, Any]) -> None:
    src = GitSource.model_validate({"metadata": {"name": name}, "spec": {
        "url": "https://git.example.com/ml/fleet.git", "ref": {"branch": "main"}, "path": "models",
        "interval": "5m"}})

    async def go(c: Any) -> None:
        await c.create(src)
        await c.patch_status(GitSource, name, status)
    run(server, go)


def test_get_and_describe_show_the_revision_the_inventory_and_the_last_error(shared_api_server, config):
    seed_source(shared_api_server, "cli-fleet", {
        "lastAppliedRevision": REV, "lastAttemptedRevision": "f" * 40,
        "inventory": [{"kind": "Model", "name": "cli-a"}, {"kind": "Model", "name": "cli-b"}],
        "conditions": [
            {"type": "Ready", "status": "False", "reason": "InvalidManifest",
             "message": "revision ffffffffffff: nothing applied: models/b.yaml: document 0: spec.replicas: ..."},
            {"type": "Stalled", "status": "True", "reason": "InvalidManifest",
             "message": "revision ffffffffffff: nothing applied: models/b.yaml: document 0: spec.replicas: ..."}]})
    table = llmgw(config, "get", "gitsources")
    assert table.exit_code == 0, table.output
    header, row = (line.split() for line in table.stdout.strip().splitlines())
    assert header == ["NAME", "URL", "REF", "REVISION", "READY", "REASON", "AGE"]
    assert row[:6] == ["cli-fleet", "https://git.example.com/ml/fleet.git", "branch:main", REV[:12], "False",
                       "InvalidManifest"]

    lines = llmgw(config, "describe", "gitsource", "cli-fleet").stdout.splitlines()
    at = lines.index("Inventory (2):")
    assert [line.split() for line in lines[at + 1:at + 4]] == [["KIND", "NAME"], ["Model", "cli-a"],
                                                                  ["Model", "cli-b"]]
    [last] = [line for line in lines if line.startswith("Last error:")]
    assert "InvalidManifest: revision ffffffffffff: nothing applied: models/b.yaml: document 0: spec.replicas" in last


def test_suspend_resume_and_reconcile_set_the_source_and_say_so(shared_api_server, config):
    seed_source(shared_api_server, "cli-sus", {})
    assert llmgw(config, "suspend", "gitsource", "cli-sus").stdout.strip() == "gitsource/cli-sus suspended"
    assert llmgw(config, "suspend", "gs", "cli-sus").stdout.strip() == "gitsource/cli-sus already suspended"
    assert run(shared_api_server, lambda c: c.get(GitSource, "cli-sus")).spec.suspend is True
    assert llmgw(config, "get", "gitsources", "cli-sus").stdout.splitlines()[1].split()[4] == "Suspended"
    assert llmgw(config, "resume", "gitsource", "cli-sus").stdout.strip() == "gitsource/cli-sus resumed"
    assert run(shared_api_server, lambda c: c.get(GitSource, "cli-sus")).spec.suspend is False

    # no controller-manager here: the request is set, and the command says that nothing handled it
    out = llmgw(config, "reconcile", "gitsource", "cli-sus", "--timeout", "0")
    assert out.exit_code == ec.ERROR and "did not handle the request within 0 s" in out.output
    assert RECONCILE_REQUESTED_AT in run(shared_api_server, lambda c: c.get(GitSource, "cli-sus")).metadata.annotations
    wrong = llmgw(config, "suspend", "model", "cli-sus")
    assert wrong.exit_code == ec.USAGE and "only a gitsource" in wrong.output


def test_a_hand_apply_of_an_object_a_source_applied_is_a_conflict_and_writes_nothing(shared_api_server, config,
                                                                                    tmp_path: Path):
    owned = run(shared_api_server, lambda c: c.create(parse_object(
        model_doc("cli-owned", labels={GITSOURCE_LABEL: "fleet"}))))
    f = tmp_path / "m.yaml"
    f.write_text(yaml.safe_dump(model_doc("cli-owned", replicas=3)))
    for dry in ((), ("--dry-run",)):
        out = llmgw(config, "apply", "-f", str(f), *dry)
        assert out.exit_code == ec.CONFLICT, out.output
        assert f"is applied by GitSource fleet (label {GITSOURCE_LABEL}=fleet)" in out.output
        assert "llmgw suspend gitsource fleet" in out.output
    live = run(shared_api_server, lambda c: c.get(Model, "cli-owned"))
    assert live.metadata.resourceVersion == owned.metadata.resourceVersion

    same = tmp_path / "same.yaml"                    # what the source applied: unchanged, not a conflict
    same.write_text(yaml.safe_dump(model_doc("cli-owned")))
    assert llmgw(config, "apply", "-f", str(same)).stdout.strip() == "model/cli-owned unchanged"

    other = tmp_path / "prune.yaml"                  # a hand prune leaves the source's objects alone
    other.write_text(yaml.safe_dump(model_doc("cli-other")))
    out = llmgw(config, "apply", "-f", str(other), "--prune", "-l", f"{GITSOURCE_LABEL}=fleet")
    assert out.stdout.strip() == "model/cli-other created"
    assert run(shared_api_server, lambda c: c.get(Model, "cli-owned")).metadata.deletionTimestamp is None

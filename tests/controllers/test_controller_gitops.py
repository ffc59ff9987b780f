"""The gitops controller against a local bare repository (file://, made by the git program), a real
controller-manager (the model and replica controllers, fake agents) and a real etcd."""
from __future__ import annotations

import dataclasses
import json
import os
import socket
import subprocess
from pathlib import Path
from typing import Any

import pytest

from controllers.gitops import GitOpsController
from controllers.settings import ControllerSettings
from llmgw.api import GitSource, Model, condition_true, get_condition
from llmgw.api.errors import NotFound
from llmgw.api.manifests import parse_object
from llmgw.api.wellknown import GITSOURCE_LABEL, RECONCILE_REQUESTED_AT
from llmgw.cmd.controller_manager import controllers
from llmgw.server.audit import AuditLog, FileBackend
from llmgw.store import StoreUnavailable
from tests.fixtures.controlplane import control_plane
from tests.fixtures.poll import until
from tests.fixtures.snapshot import lose_and_restore, save


class Repo:
    """A bare repository and a clone that commits and pushes to it."""

    def __init__(self, tmp: Path) -> None:
        self.bare, self.work = tmp / "fleet.git", tmp / "work"
        self._git(tmp, "init", "--quiet", "--bare", "--initial-branch=main", str(self.bare))
        self._git(tmp, "clone", "--quiet", str(self.bare), str(self.work))
        self._git(self.work, "checkout", "--quiet", "-b", "main")
        self.url = f"file://{self.bare}"

    @staticmethod
    def _git(cwd: Path, *args: str) -> str:
        return subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=cwd, check=True,
                              capture_output=True, text=True).stdout

    def write(self, rel: str, text: str) -> Repo:
        path = self.work / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        return self

    def rm(self, rel: str) -> Repo:
        (self.work / rel).unlink()
        return self

    def commit(self, message: str = "change") -> str:
        self._git(self.work, "add", "-A")
        self._git(self.work, "commit", "--quiet", "--allow-empty", "-m", message)
        self._git(self.work, "push", "--quiet", "origin", "HEAD:main")
        return self._git(self.work, "rev-parse", "HEAD").strip()


def model_yaml(name: str, replicas: int = 1) -> str:
    return (f"apiVersion: llmgw.io/v1\nkind: Model\nmetadata: {{name: {name}}}\n"
            f"spec:\n  replicas: {replicas}\n  profiles: [{{engine: sim}}]\n")


def source(name: str, url: str, path: str = "models", interval: str = "1s", **spec: Any) -> GitSource:
    return GitSource.model_validate({"metadata": {"name": name},
                                     "spec": {"url": url, "ref": {"branch": "main"}, "path": path,
                                              "interval": interval, **spec}})


class Counting:
    """The controller's store, counting its writes (every etcd write the controller makes goes through it)."""

    WRITES = ("create", "update", "update_status", "patch_status", "delete")

    def __init__(self, store: Any) -> None:
        self._store, self.writes = store, 0

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._store, name)
        if name not in self.WRITES:
            return attr

        async def counted(*args: Any, **kwargs: Any) -> Any:
            self.writes += 1
            return await attr(*args, **kwargs)
        return counted


@pytest.fixture
def repo(tmp_path: Path) -> Repo:
    return Repo(tmp_path)


def gitops(tmp_path: Path, audit: AuditLog | None = None, **settings: Any) -> GitOpsController:
    """The controller, its file:// URLs confined to tmp_path (where `repo` is) unless `settings` say
    otherwise; its writes audited in `audit` as the controller-manager's are."""
    return [c for c in controllers(ControllerSettings(**{"gitops_retry_base": 0.2, "gitops_retry_max": 1.0,
                                                         "git_file_root": str(tmp_path), **settings}),
                                   tmp_path / "cache", audit) if isinstance(c, GitOpsController)][0]


def counted(ctl: GitOpsController) -> tuple[Counting, list[int]]:
    """Count the controller's writes and its fetches (a fetch starts each sync: a marker that one ran)."""
    counting = Counting(ctl.ctx.store)
    ctl.ctx = dataclasses.replace(ctl.ctx, store=counting)
    fetches = [0]
    fetch = ctl.git.fetch

    async def counted_fetch(*args: Any) -> Any:
        fetches[0] += 1
        return await fetch(*args)
    ctl.git.fetch = counted_fetch  # type: ignore[method-assign]
    return counting, fetches


def ready(cp: Any, name: str) -> GitSource | None:
    src = cp.cache.get(GitSource, name)
    return src if src is not None and condition_true(src.status.conditions, "Ready") else None


async def stalled(cp: Any, name: str, reason: str) -> tuple[GitSource, str]:
    """The source once Stalled, and that condition's message, after checking its reason."""
    src = await until(lambda: (s := cp.cache.get(GitSource, name)) and condition_true(s.status.conditions, "Stalled")
                      and s, f"{name} Stalled")
    cond = get_condition(src.status.conditions, "Stalled")
    assert cond is not None and cond.reason == reason
    return src, cond.message


async def test_a_commit_adds_a_model_that_gets_ready_and_deleting_its_file_prunes_only_what_it_applied(
        store, repo, tmp_path):
    first = repo.write("models/a.yaml", model_yaml("a")).write("models/b.yaml", model_yaml("b")).commit()
    audit = AuditLog([FileBackend(str(tmp_path / "audit.log"), 1 << 20, 1, buffer=100)])
    ctl = gitops(tmp_path, audit)
    async with control_plane(store, extra=(ctl,)) as cp:
        hand = await store.create(parse_object(yaml_doc(model_yaml("hand"))))   # not the source's
        await store.create(source("fleet", repo.url))
        src = await until(lambda: ready(cp, "fleet"), "the source Ready: its Models Available")
        assert src.status.lastAppliedRevision == first
        assert [(e.kind, e.name) for e in src.status.inventory] == [("Model", "a"), ("Model", "b")]
        a = await store.get(Model, "a")
        assert a.metadata.labels[GITSOURCE_LABEL] == "fleet" and condition_true(a.status.conditions, "Available")

        second = repo.rm("models/b.yaml").commit("b goes")
        await until(lambda: (s := cp.cache.get(GitSource, "fleet")) and s.status.lastAppliedRevision == second)
        await until(lambda: cp.cache.get(Model, "b") is None, "b pruned")
        src = await until(lambda: ready(cp, "fleet"))
        assert [(e.kind, e.name) for e in src.status.inventory] == [("Model", "a")]
        assert cp.events("Pruned", "fleet")
        still = await store.get(Model, "hand")
        assert still.metadata.resourceVersion == hand.metadata.resourceVersion   # never touched
    audit.close()
    # each write of the source's is an audit line of the controller-manager, naming the source
    lines = [json.loads(x) for x in (tmp_path / "audit.log").read_text().splitlines()]
    assert sorted((x["verb"], x["name"], x["code"], x["commit"]) for x in lines) == [
        ("create", "a", 201, first), ("create", "b", 201, first), ("delete", "b", 200, second)]
    assert {(x["user"], tuple(x["groups"]), x["kind"], x["gitSource"]) for x in lines} == {
        ("controller-manager", ("llmgw:components",), "models", "fleet")}
    assert all(x["revision"] > hand.metadata.resourceVersion for x in lines)


def yaml_doc(text: str) -> dict[str, Any]:
    import yaml
    doc: dict[str, Any] = yaml.safe_load(text)
    return doc


async def test_a_hand_edit_is_reverted_at_the_next_interval_and_the_autoscalers_count_is_not_drift(
        store, repo, tmp_path):
    repo.write("models/a.yaml", model_yaml("a", replicas=1)).commit()
    ctl = gitops(tmp_path)
    async with control_plane(store, extra=(ctl,)) as cp:
        await store.create(source("fleet", repo.url))
        await until(lambda: ready(cp, "fleet"))
        live = await store.get(Model, "a")
        live.spec.replicas = 3
        live.metadata.labels["team"] = "x"           # a label the manifest does not name stays (apply's merge)
        await store.update(live)
        await until(lambda: (m := cp.cache.get(Model, "a")) and m.spec.replicas == 1, "the edit reverted")
        [ev] = await until(lambda: cp.events("DriftCorrected", "a"))
        assert ev.type == "Warning" and "spec.replicas" in ev.message and "GitSource fleet" in ev.message
        assert (await store.get(Model, "a")).metadata.labels["team"] == "x"
        await until(lambda: (m := cp.cache.get(Model, "a")) and m.status.replicas == 1 and ready(cp, "fleet"),
                    "settled: the extra replicas gone, the source Ready")

        writes, fetches = counted(ctl)
        await store.patch_status(Model, "a", {"desiredReplicas": 5})   # a controller's field
        seen = fetches[0]
        await until(lambda: fetches[0] >= seen + 3, "two more syncs")
        assert writes.writes == 0


async def test_a_resync_of_an_unchanged_commit_writes_nothing(store, repo, tmp_path):
    repo.write("models/a.yaml", model_yaml("a")).write("models/b.yaml", model_yaml("b")).commit()
    ctl = gitops(tmp_path)
    async with control_plane(store, extra=(ctl,)) as cp:
        await store.create(source("fleet", repo.url))
        await until(lambda: ready(cp, "fleet"))
        writes, fetches = counted(ctl)
        await until(lambda: fetches[0] >= 3, "syncs of the same commit")
        assert writes.writes == 0


async def test_one_bad_manifest_applies_nothing_and_the_source_names_the_file_and_the_field(store, repo, tmp_path):
    good = repo.write("models/a.yaml", model_yaml("a")).commit()
    ctl = gitops(tmp_path)
    async with control_plane(store, extra=(ctl,)) as cp:
        await store.create(source("fleet", repo.url))
        await until(lambda: ready(cp, "fleet"))
        bad = (repo.write("models/c.yaml", model_yaml("c"))
               .write("models/sub/d.yaml", model_yaml("d").replace("replicas: 1", "replicas: many")).commit())
        src, message = await stalled(cp, "fleet", "InvalidManifest")
        assert "models/sub/d.yaml: document 0: spec.replicas" in message
        assert src.status.lastAttemptedRevision == bad and src.status.lastAppliedRevision == good
        assert not condition_true(src.status.conditions, "Ready")
        with pytest.raises(NotFound):
            await store.get(Model, "c")                 # the good file of the bad commit: not applied


async def test_suspend_stops_changes_and_reconcile_acts_at_once(store, repo, tmp_path):
    repo.write("models/a.yaml", model_yaml("a")).commit()
    ctl = gitops(tmp_path)
    async with control_plane(store, extra=(ctl,)) as cp:
        await store.create(source("fleet", repo.url, interval="1h"))
        await until(lambda: ready(cp, "fleet"))
        src = await store.get(GitSource, "fleet")
        src.spec.suspend = True
        await store.update(src)
        repo.write("models/b.yaml", model_yaml("b")).commit()
        await request_reconcile(store, cp, "1")
        assert cp.cache.get(Model, "b") is None
        reconciling = get_condition((await store.get(GitSource, "fleet")).status.conditions, "Reconciling")
        assert reconciling is not None and reconciling.reason == "Suspended"

        src = await store.get(GitSource, "fleet")
        src.spec.suspend = False
        await store.update(src)
        await until(lambda: cp.cache.get(Model, "b"), "b applied on resume")
        c = repo.write("models/c.yaml", model_yaml("c")).commit()
        await request_reconcile(store, cp, "2")         # the interval is an hour: only the request syncs
        assert cp.cache.get(Model, "c") is not None
        assert cp.cache.get(GitSource, "fleet").status.lastAppliedRevision == c


async def request_reconcile(store: Any, cp: Any, value: str) -> None:
    src = await store.get(GitSource, "fleet")
    src.metadata.annotations[RECONCILE_REQUESTED_AT] = value
    await store.update(src)
    await until(lambda: cp.cache.get(GitSource, "fleet").status.lastHandledReconcileAt == value,
                f"request {value} handled")


async def test_a_source_restored_from_an_older_snapshot_applies_its_branch_again_at_once(store, etcd, repo, tmp_path):
    """etcd restored under the running manager from a snapshot taken before the branch moved: the
    source (interval an hour, so no timer helps) applies the branch's commit again at once, the
    object the snapshot brought back pruned by the snapshot's inventory, the one it lost created."""
    repo.write("models/a.yaml", model_yaml("a")).commit()
    ctl = gitops(tmp_path)
    async with control_plane(store, extra=(ctl,)) as cp:
        await store.create(source("fleet", repo.url, interval="1h"))
        await until(lambda: ready(cp, "fleet"))
        file = tmp_path / "fleet.snap"
        await save(file, "--etcd", etcd.endpoint)
        second = repo.rm("models/a.yaml").write("models/b.yaml", model_yaml("b")).commit("a goes, b comes")
        await request_reconcile(store, cp, "1")

        await lose_and_restore(etcd, file)

        async def converged() -> bool:
            models = sorted(m.metadata.name for m in (await store.list(Model))[0])
            return models == ["b"] and (await store.get(GitSource, "fleet")).status.lastAppliedRevision == second
        await until(converged, "the branch applied again: a pruned, b created", timeout=60,
                    retry=(StoreUnavailable,))     # (the store reconnects to the restored etcd)


async def test_two_sources_claiming_one_object_give_a_conflict_and_no_write_loop(store, repo, tmp_path):
    repo.write("models/a.yaml", model_yaml("a")).commit()
    ctl = gitops(tmp_path)
    async with control_plane(store, extra=(ctl,)) as cp:
        await store.create(source("first", repo.url))
        await until(lambda: ready(cp, "first"))
        owned = await store.get(Model, "a")
        await store.create(source("second", repo.url))
        _, message = await stalled(cp, "second", "OwnershipConflict")
        assert "model/a (held by GitSource first)" in message
        writes, fetches = counted(ctl)
        await until(lambda: fetches[0] >= 6, "both sources synced again, more than once")
        assert writes.writes == 0
        assert (await store.get(Model, "a")).metadata.resourceVersion == owned.metadata.resourceVersion


async def test_depends_on_orders_applies_and_prunes(store, repo, tmp_path):
    repo.write("base/a.yaml", model_yaml("a").replace("replicas: 1", "replicas: x")).write(
        "apps/b.yaml", model_yaml("b")).commit()
    ctl = gitops(tmp_path)
    async with control_plane(store, extra=(ctl,)) as cp:
        await store.create(source("base", repo.url, path="base"))
        await store.create(source("apps", repo.url, path="apps", dependsOn=["base"]))
        apps = await until(lambda: (s := cp.cache.get(GitSource, "apps"))
                           and (c := get_condition(s.status.conditions, "Reconciling"))
                           and c.reason == "DependencyNotReady" and s)
        assert "gitsource/base" in get_condition(apps.status.conditions, "Reconciling").message
        assert cp.cache.get(Model, "b") is None      # base is stalled: apps waits
        repo.write("base/a.yaml", model_yaml("a")).commit()
        await until(lambda: ready(cp, "apps"), "apps applied once base is Ready")
        a, b = await store.get(Model, "a"), await store.get(Model, "b")
        assert a.metadata.creationTimestamp <= b.metadata.creationTimestamp

        gone: list[str] = []
        await store.delete(GitSource, "base")
        base = await until(lambda: (s := cp.cache.get(GitSource, "base"))
                           and (c := get_condition(s.status.conditions, "Reconciling"))
                           and c.reason == "DependantsExist" and s)
        assert base.metadata.deletionTimestamp is not None and cp.cache.get(Model, "a") is not None
        await store.delete(GitSource, "apps")
        await until(lambda: cp.cache.get(GitSource, "base") is None and cp.cache.get(GitSource, "apps") is None)
        for name in ("a", "b"):
            try:
                await store.get(Model, name)
            except NotFound:
                gone.append(name)
        assert gone == ["a", "b"]


async def test_an_object_applied_by_hand_before_the_source_is_a_conflict_left_as_it_is(store, repo, tmp_path):
    repo.write("models/a.yaml", model_yaml("a", replicas=2)).write("models/b.yaml", model_yaml("b")).commit()
    ctl = gitops(tmp_path)
    async with control_plane(store, extra=(ctl,)) as cp:
        hand = await store.create(parse_object(yaml_doc(model_yaml("a"))))     # `llmgw apply` by hand, no label
        await store.create(source("fleet", repo.url))
        _, message = await stalled(cp, "fleet", "OwnershipConflict")
        assert "model/a (held by no GitSource (applied by hand))" in message
        assert (await store.get(Model, "a")).metadata.resourceVersion == hand.metadata.resourceVersion
        with pytest.raises(NotFound):
            await store.get(Model, "b")                 # one pass: nothing of the commit is applied


async def test_fetches_that_hang_hold_no_worker_and_other_sources_sync_meanwhile(store, repo, tmp_path):
    """As many fetches as the controller has workers hang on a remote that never answers (it
    listens, and says nothing: git waits for up to git_timeout, two minutes); a third source syncs."""
    repo.write("models/a.yaml", model_yaml("a")).commit()
    ctl = gitops(tmp_path)
    with socket.create_server(("127.0.0.1", 0)) as silent:
        url = f"https://127.0.0.1:{silent.getsockname()[1]}/fleet.git"
        async with control_plane(store, extra=(ctl,)) as cp:
            _, fetches = counted(ctl)
            stuck = [f"stuck-{n}" for n in range(ctl.workers)]
            for name in stuck:
                await store.create(source(name, url))
            await until(lambda: fetches[0] >= len(stuck), "the fetches that hang started")
            await store.create(source("fleet", repo.url))
            await until(lambda: ready(cp, "fleet"), "the third source Ready while the others' fetches hang")
            assert not any(ready(cp, name) for name in stuck)


async def test_a_source_reads_no_credentials_file_and_no_repository_beyond_where_the_manager_was_told(
        store, repo, tmp_path):
    """secretRef.file is read in --git-credentials-dir only, and a file:// URL under --git-file-root
    only, links resolved: a link out of either is refused before anything is read (the link's
    target is a FIFO no one writes, so reading it would hang) and before git runs (no checkout)."""
    repo.write("models/a.yaml", model_yaml("a")).commit()
    creds, root = tmp_path / "creds", tmp_path / "repos"
    creds.mkdir()
    root.mkdir()
    os.mkfifo(tmp_path / "etcd.key")
    (creds / "fleet.token").symlink_to(tmp_path / "etcd.key")
    (root / "fleet.git").symlink_to(repo.bare)
    ctl = gitops(tmp_path, git_credentials_dir=str(creds), git_file_root=str(root))
    with socket.create_server(("127.0.0.1", 0)) as silent:
        url = f"https://127.0.0.1:{silent.getsockname()[1]}/fleet.git"
        async with control_plane(store, extra=(ctl,)) as cp:
            await store.create(source("token", url, secretRef={"file": "fleet.token"}))
            await store.create(source("outside", repo.url))
            await store.create(source("linked", f"file://{root}/fleet.git"))
            for name, what in (("token", "secretRef.file fleet.token"), ("outside", repo.url),
                               ("linked", f"file://{root}/fleet.git")):
                cond = await until(lambda n=name: (s := cp.cache.get(GitSource, n)) and (c := get_condition(
                    s.status.conditions, "Ready")) and c.reason == "FetchFailed" and c, f"{name} refused")
                assert cond.status == "False", name
                assert f"{what}: outside " in cond.message and "where the controller-manager confines it" \
                    in cond.message, cond.message
                assert not (tmp_path / "cache" / name).exists(), name   # git never ran for it

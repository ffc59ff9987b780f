"""`llmgw ctl snapshot save/inspect/restore` against real etcd over TLS: what is saved is what a
restored member (one, or a new cluster of three) serves; bad files are refused in one line and
nothing is written."""
from __future__ import annotations

import asyncio
import hashlib
import json
import os
import shutil
from pathlib import Path

import aiohttp
import pytest
from click.testing import CliRunner, Result

from llmgw.api import ApiKey, Model, Node, Shard
from llmgw.api.secrets import new_secret
from llmgw.cli.create import build_key
from llmgw.cli.main import cli
from llmgw.client import Client, ClientConfig
from llmgw.dev.cluster import LocalCluster, NodePlan
from llmgw.dev.etcd import EtcdCluster, etcd_cluster
from llmgw.dev.process import free_port
from llmgw.pki import CertificateAuthority
from llmgw.store import Store
from llmgw.store.snapshot import MAGIC
from tests.fixtures.cluster import api_server, ca_dir, llmgw_ca, make_pki, until_revoked  # noqa: F401
from tests.fixtures.ctrlkit import model
from tests.fixtures.poll import until


def llmgw(*args: str) -> Result:
    return CliRunner().invoke(cli, ["ctl", "snapshot", *args])


async def allmgw(*args: str) -> Result:
    """llmgw(...) from a test's event loop: the command runs its own."""
    return await asyncio.to_thread(llmgw, *args)


@pytest.fixture
def secured(tmp_path):
    """A one-member etcd requiring a client certificate from the etcd CA, and that certificate's flags."""
    pki = make_pki(tmp_path / "ca")
    etcd = etcd_cluster(tmp_path / "etcd", 1, ca=CertificateAuthority(pki.dir)).start()
    issued = CertificateAuthority(pki.dir).etcd().issue("etcd-client", "backup")
    flags = ["--etcd", etcd.endpoint, "--etcd-ca", str(pki.dir / "etcd" / "ca.crt"),
             "--etcd-cert", issued.cert, "--etcd-key", issued.key]
    yield etcd, flags
    etcd.stop()


async def _models(endpoints: list[str]) -> list[str]:
    async with Store(endpoints) as store:
        return sorted(m.metadata.name for m in (await store.list(Model))[0])


@pytest.fixture
async def saved(secured, tmp_path):
    """A snapshot of two Models and a revocation; a third Model created after it."""
    etcd, flags = secured
    async with Store(etcd.endpoint, ca=flags[3], cert=flags[5], key=flags[7]) as store:
        for name in ("a", "b"):
            await store.create(model(name))
        await store.revocations.add("0a1b", {"name": "stolen"})
        file = tmp_path / "backup" / "fleet.snap"
        file.parent.mkdir()
        result = await allmgw("save", str(file), *flags)
        assert result.exit_code == 0, result.output
        await store.create(model("after"))
    return file, result.output


def _header(file: Path) -> dict[str, object]:
    with file.open("rb") as f:
        assert f.readline() == MAGIC
        header: dict[str, object] = json.loads(f.readline())
        payload = f.read()
    assert header["size"] == len(payload)
    assert header["sha256"] == hashlib.sha256(payload).hexdigest()
    return header


async def test_save_writes_the_header_and_inspect_counts_what_it_holds(saved):
    file, output = saved
    header = _header(file)
    assert output == f"saved {file}: revision {header['revision']}, {header['size']} bytes, sha256 {header['sha256']}\n"
    assert [p.name for p in file.parent.iterdir()] == ["fleet.snap"]          # no temporary file left
    result = await allmgw("inspect", str(file))
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert lines[0].startswith(f"{file}: revision {header['revision']}, {header['size']} bytes, sha256 ")
    assert [line.split() for line in lines[1:]] == [["models", "2"], ["revocations", "1"]]


def _restore(cluster: EtcdCluster, file: Path) -> None:
    """Restore file into each member's (new) data directory as the README's runbook says; start the cluster."""
    initial = ",".join(f"{m.name}={m.peer_url}" for m in cluster.members)
    for m in cluster.members:
        result = llmgw("restore", str(file), "--data-dir", str(m.data_dir), "--name", m.name,
                       "--initial-cluster", initial, "--initial-advertise-peer-urls", m.peer_url,
                       "--initial-cluster-token", "restored")
        assert result.exit_code == 0, result.output
    cluster.start(tries=1)


@pytest.mark.parametrize("members", [1, 3])
async def test_a_restored_cluster_holds_what_the_snapshot_held(saved, tmp_path, members):
    file, _ = saved
    cluster = etcd_cluster(tmp_path / "restored", members)
    _restore(cluster, file)
    try:
        assert await _models(cluster.endpoints) == ["a", "b"]
    finally:
        cluster.stop()


def test_save_without_the_etcd_client_certificate_is_refused_and_writes_nothing(secured, tmp_path):
    etcd, flags = secured
    result = llmgw("save", str(tmp_path / "fleet.snap"), *flags[:4])       # the CA, no client certificate
    assert result.exit_code == 1
    assert result.output.startswith(f"Error: snapshot of etcd at {etcd.endpoint} not saved: ")
    assert "etcd refused this client's TLS certificate" in result.output
    assert result.output.count("\n") == 1
    assert not (tmp_path / "fleet.snap").exists() and not list(tmp_path.glob(".fleet.snap.*"))


def _bad_files(good: bytes, directory: Path) -> dict[str, tuple[Path, str]]:
    """Broken copies of a good snapshot, and what refusing each must say."""
    header_end = good.index(b"\n", len(MAGIC)) + 1
    header = json.loads(good[len(MAGIC):header_end])
    wrong = json.dumps({**header, "sha256": "0" * 64}, sort_keys=True).encode()
    cases = {
        "truncated": (good[:-100], f"truncated: its header records {header['size']} bytes of etcd snapshot, "
                                   f"the file holds {header['size'] - 100}"),
        "too-long": (good + b"x", "too long"),
        "foreign": (b"SQLite format 3\0" + bytes(5000), "not an llmgw snapshot (it does not begin with "
                                                        "'llmgw-snapshot 1')"),
        "raw-etcd": (good[header_end:], "not an llmgw snapshot"),
        "cut-header": (good[:len(MAGIC) + 20], "truncated or broken header"),
        "broken-header": (MAGIC + b"{not json\n" + good[header_end:], "broken header: "),
        "wrong-checksum": (MAGIC + wrong + b"\n" + good[header_end:],
                           f"corrupt: the etcd snapshot's sha256 is {header['sha256']}, its header records "
                           + "0" * 64),
    }
    out = {}
    for name, (content, message) in cases.items():
        path = directory / name
        path.write_bytes(content)
        out[name] = (path, message)
    return out


async def test_bad_files_are_refused_in_one_line_and_nothing_is_written(saved, tmp_path):
    file, _ = saved
    for name, (path, message) in _bad_files(file.read_bytes(), tmp_path).items():
        data_dir = tmp_path / f"{name}.etcd"
        for args in (("inspect", str(path)), ("restore", str(path), "--data-dir", str(data_dir))):
            result = await allmgw(*args)
            assert result.exit_code == 1, (name, args[0], result.output)
            assert result.output == f"Error: {path}: {result.output.split(': ', 2)[2]}", (name, args[0])
            assert message in result.output and result.output.count("\n") == 1, (name, args[0], result.output)
        assert not data_dir.exists()


def test_restore_refuses_an_existing_data_dir_and_a_failed_one_leaves_none(saved, tmp_path):
    file, _ = saved
    (tmp_path / "data").mkdir()
    result = llmgw("restore", str(file), "--data-dir", str(tmp_path / "data"))
    assert result.exit_code == 1
    assert result.output == f"Error: --data-dir {tmp_path / 'data'} exists: etcd restores into a new directory only\n"
    result = llmgw("restore", str(file), "--data-dir", str(tmp_path / "new"), "--initial-cluster", "nonsense")
    assert result.exit_code == 1
    assert result.output.startswith("Error: etcdctl snapshot restore: ") and result.output.count("\n") == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["backup", "ca", "data", "etcd"]


async def test_a_revocation_lost_by_a_restore_is_warned_of_at_start_and_replayed(etcd, api_server, tmp_path):
    srv = api_server
    admin = ["--server", srv.url, "--ca", srv.ca, "--cert", srv.admin[0], "--key", srv.admin[1]]
    ident = srv.issue_node("stolen")
    async with srv.client(ident) as c:
        await c.create(Node.model_validate({"metadata": {"name": "stolen"}}))
    file = tmp_path / "before.snap"
    assert (await allmgw("save", str(file), "--etcd", etcd.endpoint)).exit_code == 0
    out = await asyncio.to_thread(llmgw_ca, "revoke", "--node", "stolen", "--dir", str(srv.pki.dir), *admin)
    serial = out.split()[-1]
    async with srv.client(ident) as c:
        await until_revoked(c, "stolen")
    journal = CertificateAuthority(srv.pki.dir)
    assert [(e.serial, e.role, e.name) for e in journal.journaled()] == [(serial, "node", "stolen")]

    srv.stop()                                  # etcd lost: restored from the snapshot before the revocation
    etcd.stop()
    shutil.rmtree(etcd.members[0].data_dir)
    _restore(etcd, file)
    srv.restart()
    warning = srv.wait_for_log("etcd's revocation list is older than the CA's journal")
    assert f"lacks 1 revocation(s), the newest made {journal.journaled()[0].revokedAt}" in warning
    assert warning.endswith(f"`llmgw ca revoke --replay --dir {journal.dir}`: {serial}")
    async with srv.client(ident) as c:
        await c.heartbeat("stolen")             # the restore lost the revocation: accepted again
        out = await asyncio.to_thread(llmgw_ca, "revoke", "--replay", "--dir", str(srv.pki.dir), *admin)
        assert out == f"replayed {serial}\n1 revocation(s) of {journal.journal_path} replayed\n"
        await until_revoked(c, "stolen")
    assert len(journal.journaled()) == 1        # a replay is not a new revocation
    srv.restart()
    assert sum("older than the CA's journal" in line for line in srv.log_lines()) == 1


def _model(name: str) -> Model:
    return Model.model_validate({"metadata": {"name": name}, "spec": {
        "replicas": 1, "profiles": [{"engine": "sim", "gpusPerNode": 8}]}})   # a whole node


async def _engines(c: Client) -> dict[str, int | None]:
    """Every Shard's engine pid, by Shard name."""
    return {s.metadata.name: s.status.pid for s in (await c.list(Shard))[0]}


def _alive(pid: int | None) -> bool:
    if pid is None:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


async def _key(c: Client, name: str) -> str:
    """A new ApiKey for every model; its secret."""
    secret = new_secret(name)
    await c.create(build_key(name, secret, owner="drill", models=(), selector=(), expires=None, rpm=None, tpm=None,
                             concurrency=None, priority="standard"))
    return secret


async def _complete(http: aiohttp.ClientSession, url: str, secret: str, model: str) -> str:
    """"ok", or what answered instead."""
    body = {"model": model, "prompt": "hi", "max_tokens": 2}
    try:
        async with http.post(url + "/v1/completions", json=body, headers={"Authorization": f"Bearer {secret}"}) as r:
            return "ok" if r.status == 200 else f"{r.status}: {(await r.text())[:200]}"
    except aiohttp.ClientError as err:
        return repr(err)


async def _ok(http: aiohttp.ClientSession, url: str, secret: str) -> bool:
    return await _complete(http, url, secret, "kept") == "ok"


async def _load(url: str, secret: str, model: str, outcomes: list[str], stop: asyncio.Event) -> None:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as http:
        while not stop.is_set():
            outcomes.append(await _complete(http, url, secret, model))
            await asyncio.sleep(0.05)


def _bookings(shards: list[Shard]) -> list[tuple[str, str, int]]:
    """(node, "gpu" or "port", number) of each Shard's GPUs and ports."""
    return [(s.spec.node, what, n) for s in shards
            for what, numbers in (("gpu", s.spec.gpus), ("port", [s.spec.ports.serve, s.spec.ports.distInit]))
            for n in numbers]


@pytest.mark.timeout(300)
@pytest.mark.faults   # 0 failed requests under load through a restore: a fault scenario
async def test_drill_etcd_lost_and_restored_under_load(tmp_path):
    """A real local cluster (a Model a node): a snapshot, then one Model deleted and one created on the
    node it freed, then etcd's data lost and restored from the snapshot, the server and the
    controller-manager restarted on it (the README's runbook), requests to a Model of the snapshot
    going on through the gateway all along with an API key of the snapshot. The engine that ran at the
    snapshot keeps its pid, the one created after it is stopped, the deleted one started again, no GPU
    or port booked twice; a key made after the snapshot is refused again."""
    cluster = LocalCluster(tmp_path / "cluster", [NodePlan("node01", "ib-a"), NodePlan("node02", "ib-a")],
                           gateway_port=free_port(), node_grace=3.0, drain_delay=1.0, lease_seconds=4.0,
                           gateway_args=["--watch-api-keys"])
    outcomes: list[str] = []
    stop = asyncio.Event()
    load: asyncio.Task[None] | None = None
    try:
        await asyncio.to_thread(cluster.start)
        async with Client.from_config(ClientConfig.load(cluster.admin_config)) as c:
            async def ready(name: str) -> bool:
                return (await c.get(Model, name)).status.readyReplicas == 1
            for name in ("kept", "deleted"):
                await c.create(_model(name))
                await until(lambda name=name: ready(name), f"Model {name} Ready", timeout=120)
            at_snapshot = await _engines(c)
            secret = await _key(c, "at-snapshot")
            async with aiohttp.ClientSession() as http:
                await until(lambda: _ok(http, cluster.gateway_url, secret), "the key known to the gateway")
                load = asyncio.create_task(_load(cluster.gateway_url, secret, "kept", outcomes, stop))
            file = tmp_path / "fleet.snap"
            result = await allmgw("save", str(file), *cluster.etcd_flags("dev-admin"))
            assert result.exit_code == 0, result.output
            await c.delete(Model, "deleted")
            deleted = {k: v for k, v in at_snapshot.items() if k.startswith("deleted-")}
            await until(lambda: not any(_alive(pid) for pid in deleted.values()), "the deleted Model's engine gone")
            await c.create(_model("created"))       # booked where the deleted one was, where that is free
            await until(lambda: ready("created"), "Model created Ready", timeout=120)
            created = {k: v for k, v in (await _engines(c)).items() if k not in at_snapshot}
            later = await _key(c, "after-snapshot")
            async with aiohttp.ClientSession() as http:
                await until(lambda: _ok(http, cluster.gateway_url, later), "the later key known to the gateway")

        for name in ("server", "controller-manager"):      # the README's runbook, step by step
            cluster.stop_process(name)
            cluster.procs.pop(name)
        etcd = cluster.etcd
        assert etcd is not None
        etcd.stop()                                         # every member's data lost
        for m in etcd.members:
            shutil.rmtree(m.data_dir)
        await asyncio.to_thread(_restore, etcd, file)
        cluster.start_server()
        await asyncio.to_thread(cluster.wait_server)
        cluster.start_controller_manager()

        async with Client.from_config(ClientConfig.load(cluster.admin_config)) as c:
            async def rebuilt() -> bool:    # (its status in the snapshot says Ready, with the old pid)
                pids = [pid for name, pid in (await _engines(c)).items() if name.startswith("deleted-")]
                return bool(pids) and all(_alive(pid) and pid not in deleted.values() for pid in pids)
            await until(rebuilt, "the deleted Model's engine started again", timeout=120)
            await until(lambda: ready("deleted"), "the deleted Model Ready", timeout=60)
            await until(lambda: not any(_alive(pid) for pid in created.values()),
                        "the engine of the Model created after the snapshot stopped")
            assert sorted(m.metadata.name for m in (await c.list(Model))[0]) == ["deleted", "kept"]
            engines = await _engines(c)
            bookings = _bookings((await c.list(Shard))[0])
            assert [k.metadata.name for k in (await c.list(ApiKey))[0]] == ["at-snapshot"]
        async with aiohttp.ClientSession() as http:
            async def refused() -> bool:
                return (await _complete(http, cluster.gateway_url, later, "kept")).startswith("401: ")
            await until(refused, "the key made after the snapshot refused by the gateway")
        assert len(bookings) == len(set(bookings)), bookings    # no GPU or port booked twice
        kept = {k: v for k, v in at_snapshot.items() if k.startswith("kept-")}
        assert {k: engines[k] for k in kept} == kept and all(_alive(pid) for pid in kept.values())
        await asyncio.sleep(3)
    finally:
        stop.set()
        if load is not None:
            await load
        await asyncio.to_thread(cluster.stop)
    assert outcomes and set(outcomes) == {"ok"}, [o for o in outcomes if o != "ok"][:5]

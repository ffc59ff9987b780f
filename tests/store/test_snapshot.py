"""`llmgw ctl snapshot save/inspect/restore` against real etcd over TLS: what is saved is what a
restored member (one, or a new cluster of three) serves; bad files are refused in one line and
nothing is written."""
from __future__ import annotations

import asyncio
import hashlib
import json
from pathlib import Path

import pytest

from llmgw.api import Model, Node
from llmgw.api.errors import Expired
from llmgw.backoff import Backoff
from llmgw.dev.etcd import etcd_cluster
from llmgw.pki import CertificateAuthority
from llmgw.reflector import Reflector, object_name
from llmgw.store import Store
from llmgw.store import keys as K
from llmgw.store.errors import Restored
from llmgw.store.etcd import Lineage
from llmgw.store.snapshot import MAGIC
from tests.fixtures.cluster import api_server, ca_dir, llmgw_ca, make_pki, until_revoked  # noqa: F401
from tests.fixtures.ctrlkit import model
from tests.fixtures.poll import until
from tests.fixtures.snapshot import asnapshot_cli, lose_and_restore, restore, save, snapshot_cli


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
        result = await asnapshot_cli("save", str(file), *flags)
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
    result = await asnapshot_cli("inspect", str(file))
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert lines[0].startswith(f"{file}: revision {header['revision']}, {header['size']} bytes, sha256 ")
    assert [line.split() for line in lines[1:]] == [["models", "2"], ["revocations", "1"]]


@pytest.mark.parametrize("members", [1, 3])
async def test_a_restored_cluster_holds_what_the_snapshot_held(saved, tmp_path, members):
    file, _ = saved
    cluster = etcd_cluster(tmp_path / "restored", members)
    restore(cluster, file)
    try:
        assert await _models(cluster.endpoints) == ["a", "b"]
    finally:
        cluster.stop()


def test_save_without_the_etcd_client_certificate_is_refused_and_writes_nothing(secured, tmp_path):
    etcd, flags = secured
    result = snapshot_cli("save", str(tmp_path / "fleet.snap"), *flags[:4])       # the CA, no client certificate
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
            result = await asnapshot_cli(*args)
            assert result.exit_code == 1, (name, args[0], result.output)
            assert result.output == f"Error: {path}: {result.output.split(': ', 2)[2]}", (name, args[0])
            assert message in result.output and result.output.count("\n") == 1, (name, args[0], result.output)
        assert not data_dir.exists()


def test_restore_refuses_an_existing_data_dir_and_a_failed_one_leaves_none(saved, tmp_path):
    file, _ = saved
    (tmp_path / "data").mkdir()
    result = snapshot_cli("restore", str(file), "--data-dir", str(tmp_path / "data"))
    assert result.exit_code == 1
    assert result.output == f"Error: --data-dir {tmp_path / 'data'} exists: etcd restores into a new directory only\n"
    result = snapshot_cli("restore", str(file), "--data-dir", str(tmp_path / "new"), "--initial-cluster", "nonsense")
    assert result.exit_code == 1
    assert result.output.startswith("Error: etcdctl snapshot restore: ") and result.output.count("\n") == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["backup", "ca", "data", "etcd"]


async def test_a_revocation_lost_by_a_restore_is_warned_of_and_replayed(etcd, api_server, tmp_path):
    srv = api_server
    admin = ["--server", srv.url, "--ca", srv.ca, "--cert", srv.admin[0], "--key", srv.admin[1]]
    ident = srv.issue_node("stolen")
    async with srv.client(ident) as c:
        await c.create(Node.model_validate({"metadata": {"name": "stolen"}}))
    file = tmp_path / "before.snap"
    await save(file, "--etcd", etcd.endpoint)
    out = await asyncio.to_thread(llmgw_ca, "revoke", "--node", "stolen", "--dir", str(srv.pki.dir), *admin)
    serial = out.split()[-1]
    async with srv.client(ident) as c:
        await until_revoked(c, "stolen")
    journal = CertificateAuthority(srv.pki.dir)
    assert [(e.serial, e.role, e.name) for e in journal.journaled()] == [(serial, "node", "stolen")]

    await lose_and_restore(etcd, file)          # under the running server: from the snapshot before the revocation
    warning = srv.wait_for_log("etcd's revocation list is older than the CA's journal")   # on its relist
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


async def test_a_server_running_through_a_restore_ends_its_watches_and_its_reflectors_relist(etcd, api_server,
                                                                                              tmp_path):
    """etcd restored under a running server and a store reflector (the controller-manager's
    informers): the server's open watch ends with 410 Expired saying why, and what it then
    serves is the restored history; the reflector relists (the Model made after the snapshot
    DELETED). A watch whose revision etcd's restored history has caught up is told by etcd's
    cluster id."""
    async with api_server.client() as c, Store(etcd.endpoint) as store:
        await c.create(model("a"))
        file = tmp_path / "before.snap"
        await save(file, "--etcd", etcd.endpoint)
        after = await c.create(model("after"))
        seen: list[tuple[str, str]] = []
        reflector = Reflector(store.lister_watcher(Model), lambda t, m, _: seen.append((t, m.metadata.name)),
                              key=object_name, backoff=Backoff(0.1, 0.5))
        relisting = asyncio.create_task(reflector.run())
        await until(lambda: ("ADDED", "after") in seen, "the reflector listed")
        lineage = Lineage()
        await store.etcd.same_history(after.metadata.resourceVersion + 1, lineage)
        watched: list[str] = []

        async def watch() -> None:
            async for ev in c.watch(Model, after.metadata.resourceVersion + 1):
                watched.append(ev.object.metadata.name)
        watching = asyncio.create_task(watch())
        await c.create(model("b"))
        await until(lambda: watched == ["b"], "the server's watch open")

        await lose_and_restore(etcd, file)  # the server and the store stay up: etcd restored under them
        with pytest.raises(Expired, match=r"is newer than etcd's revision \d+ \(etcd restored"):
            await asyncio.wait_for(watching, 30)
        await until(lambda: ("DELETED", "after") in seen, "the reflector relisted the restored etcd")
        assert ("DELETED", "b") in seen and reflector.lists == 2
        listed, revision = await c.list(Model)
        assert [m.metadata.name for m in listed] == ["a"]
        await c.create(model("c"))
        async with asyncio.timeout(10):
            async for ev in c.watch(Model, revision + 1):  # the server's cache serves the restored history
                assert (ev.type, ev.object.metadata.name) == ("ADDED", "c")
                break
        while (await store.revision()) <= after.metadata.resourceVersion:
            await store.kv.put(K.ROOT + "/drill", b"x")     # etcd's history caught up with the old one
        with pytest.raises(Restored, match="etcd's cluster id changed from"):
            await store.etcd.same_history(after.metadata.resourceVersion + 1, lineage)
        relisting.cancel()

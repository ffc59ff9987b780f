"""`llmgw ctl snapshot`: save etcd's snapshot to a file, inspect one, restore one into a new data directory.

The file's format, its checks and the etcd side are llmgw.store.snapshot's; here are the
commands, and the throwaway etcd `inspect` reads a snapshot with (restored into a temporary
directory and served on loopback, then stopped and removed).
"""
from __future__ import annotations

import asyncio
import tempfile
from collections.abc import Awaitable
from pathlib import Path
from typing import TypeVar

import click

from llmgw.cmd.etcdflags import etcd_tls
from llmgw.store import StoreError
from llmgw.store.connection import Connection
from llmgw.store.snapshot import Snapshot, SnapshotError, census, open_snapshot, restore, save, stream
from llmgw.version import version

T = TypeVar("T")

file_argument = click.argument("file", type=click.Path(exists=True, dir_okay=False, path_type=Path))


def _checked(path: Path) -> Snapshot:
    try:
        return open_snapshot(path)
    except SnapshotError as err:
        raise click.ClickException(str(err)) from None


async def _closing(conn: Connection, work: Awaitable[T]) -> T:
    try:
        return await work
    finally:
        await conn.close()


@click.group()
def snapshot() -> None:
    """etcd's snapshot: everything llmgw knows, in one file (docs/contracts.md, "Backup and restore")."""


@snapshot.command("save")
@click.argument("file", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--etcd", envvar="LLMGW_ETCD", default="http://127.0.0.1:2379", show_default=True,
              help="etcd endpoint(s), comma-separated; the first that answers is snapshotted.")
@etcd_tls
def save_command(file: Path, etcd: str, etcd_ca: str | None, etcd_cert: str | None, etcd_key: str | None) -> None:
    """Save etcd's snapshot to FILE (atomically: FILE is whole or untouched), behind a header
    recording its revision, size, sha256 and llmgw's version."""
    conn = Connection(etcd, etcd_ca, etcd_cert, etcd_key)
    try:
        header = save(file, version(), lambda out: asyncio.run(_closing(conn, stream(conn, out))))
    except (StoreError, SnapshotError, OSError) as err:
        raise click.ClickException(f"snapshot of etcd at {etcd} not saved: {err}") from None
    click.echo(f"saved {file}: revision {header.revision}, {header.size} bytes, sha256 {header.sha256}")


@snapshot.command("inspect")
@file_argument
def inspect_command(file: Path) -> None:
    """Check FILE and print its revision and how many objects of each kind it holds."""
    from llmgw.dev.etcd import etcd_cluster

    snap = _checked(file)
    with tempfile.TemporaryDirectory(prefix="llmgw-inspect-") as tmp:
        cluster = etcd_cluster(Path(tmp))
        member = cluster.members[0]
        try:
            restore(snap, member.data_dir, {"name": member.name, "initial-cluster": f"{member.name}={member.peer_url}",
                                            "initial-advertise-peer-urls": member.peer_url})
            cluster.start(tries=1)   # a retry would start it on a new, empty data directory
            conn = Connection(member.endpoint)
            revision, counts = asyncio.run(_closing(conn, census(conn)))
        except (SnapshotError, StoreError, RuntimeError, OSError) as err:   # (TimeoutError is an OSError)
            raise click.ClickException(f"{file}: cannot read it: {err}") from None
        finally:
            cluster.stop()
    h = snap.header
    click.echo(f"{file}: revision {revision}, {h.size} bytes, sha256 {h.sha256}, saved {h.created} by llmgw {h.llmgw}")
    width = max((len(kind) for kind in counts), default=0)
    for kind, count in counts.items():
        click.echo(f"  {kind:<{width}}  {count}")


@snapshot.command("restore")
@file_argument
@click.option("--data-dir", required=True, type=click.Path(file_okay=False, path_type=Path),
              help="The new member's data directory (must not exist).")
@click.option("--name", help="The member's name (etcd's --name); default: etcd's, \"default\".")
@click.option("--initial-cluster", help="Every member of the new cluster, NAME=PEER_URL,... (etcd's flag).")
@click.option("--initial-advertise-peer-urls", help="This member's peer URLs (etcd's flag).")
@click.option("--initial-cluster-token", help="The new cluster's token (etcd's flag).")
def restore_command(file: Path, data_dir: Path, name: str | None, initial_cluster: str | None,
                    initial_advertise_peer_urls: str | None, initial_cluster_token: str | None) -> None:
    """Check FILE, then restore it into a new etcd data directory (one per member of the new
    cluster, with the same --initial-cluster); start etcd on it with the same --name and peer URLs."""
    snap = _checked(file)
    flags = {"name": name, "initial-cluster": initial_cluster,
             "initial-advertise-peer-urls": initial_advertise_peer_urls, "initial-cluster-token": initial_cluster_token}
    try:
        restore(snap, data_dir.absolute(), {flag: value for flag, value in flags.items() if value is not None})
    except (SnapshotError, OSError) as err:
        raise click.ClickException(str(err)) from None
    click.echo(f"restored {file} (revision {snap.header.revision}) into {data_dir}")

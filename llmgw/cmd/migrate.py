"""`llmgw ctl migrate-storage`: rewrite every stored object in its kind's current storage version
(llmgw.api.storage; docs/contracts.md, "Storage versions"), before the last reader of an older
version is retired."""
from __future__ import annotations

import asyncio

import click

from llmgw.api import KINDS, InvalidObject
from llmgw.cmd.etcdflags import etcd_tls
from llmgw.store import Store, StoreError


async def _migrate(store: Store) -> dict[str, tuple[int, int]]:
    async with store:
        return {plural: await store.migrate(kind) for plural, kind in KINDS.items()}


@click.command("migrate-storage")
@click.option("--etcd", envvar="LLMGW_ETCD", default="http://127.0.0.1:2379", show_default=True,
              help="etcd endpoint(s), comma-separated.")
@etcd_tls
def migrate_storage(etcd: str, etcd_ca: str | None, etcd_cert: str | None, etcd_key: str | None) -> None:
    """Rewrite every object stored in an older version in the current one, one compare-and-swap
    each (a concurrent change is read again, never overwritten), and print, per kind, how many
    were rewritten and how many were current. Run it with the servers upgraded, before the next
    upgrade: a release reads the storage versions of the release before it, no older."""
    store = Store(etcd, ca=etcd_ca, cert=etcd_cert, key=etcd_key, batch_writes=False)
    try:
        counts = asyncio.run(_migrate(store))
    except (StoreError, InvalidObject) as err:
        raise click.ClickException(f"storage of etcd at {etcd} not migrated: {err}") from None
    width = max(len(kind) for kind in counts)
    for kind, (migrated, current) in counts.items():
        click.echo(f"{kind:<{width}}  {migrated} migrated, {current} current")

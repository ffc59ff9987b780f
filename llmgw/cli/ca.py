"""`llmgw ca`: the cluster's certificate authority (init, issue, revoke, list, status)."""
from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import NoReturn

import click

from llmgw.cli.connect import Connection, checked, connection_options, run
from llmgw.cli.errors import EXIT_CODES_HELP
from llmgw.pki import (
    DEFAULT_DAYS,
    ETCD_ROLES,
    USER_DAYS,
    CAError,
    CertificateAuthority,
    Issued,
    identity_from_pem_file,
    normalize_serial,
)
from llmgw.printers.table import print_table

dir_option = click.option("--dir", "directory", envvar="LLMGW_CA_DIR", default="~/.config/llmgw/ca",
                          show_default=True, help="CA directory (or $LLMGW_CA_DIR).")
days_option = click.option("--days", type=int, default=DEFAULT_DAYS, show_default=True, help="Validity in days.")
not_before_option = click.option(
    "--not-before", type=click.DateTime(["%Y-%m-%d", "%Y-%m-%dT%H:%M:%S"]), default=None,
    help="Start of validity (UTC; default: an hour ago, for clocks behind the issuer's).")


def _ca(directory: str) -> CertificateAuthority:
    return CertificateAuthority(directory)


def _fail(err: Exception) -> NoReturn:
    raise click.ClickException(str(err))


def _issue(directory: str, role: str, name: str, sans: Sequence[str] = (), days: int = DEFAULT_DAYS,
           not_before: datetime | None = None, groups: Sequence[str] = ()) -> Issued:
    start = not_before.replace(tzinfo=timezone.utc) if not_before else None
    try:
        authority = _ca(directory).etcd() if role in ETCD_ROLES else _ca(directory)
        entry = authority.issue(role, name, list(sans), days=days, not_before=start, groups=groups)
    except CAError as err:
        _fail(err)
    click.echo(f"issued {role} {name}: serial {entry.serial}, valid until {entry.not_after}")
    click.echo(f"  cert {entry.cert}")
    click.echo(f"  key  {entry.key}")
    return entry


@click.group()
def ca() -> None:
    """Certificate authority: every identity in llmgw is a certificate it signed."""


@ca.command()
@dir_option
@click.option("--days", type=int, default=3650, show_default=True, help="Validity of the root in days.")
def init(directory: str, days: int) -> None:
    """Create a new root (ECDSA P-256) in --dir."""
    try:
        path = _ca(directory).init(days=days)
    except CAError as err:
        _fail(err)
    click.echo(f"CA created: {path} (private key {path.with_name('ca.key')}, mode 0600)")
    click.echo(f"etcd CA created: {path.parent / 'etcd' / 'ca.crt'} (signs only etcd's member and client "
               "certificates: `llmgw ca issue etcd-member|etcd-client`)")
    click.echo(f"signer created: {path.parent / 'signer.crt'} (the API servers' --signer-cert and --signer-key: "
               "they renew nodes' and components' certificates with it, the root's key stays here)")


@ca.group()
def issue() -> None:
    """Issue a certificate for a node, an admin, a component, the server, or etcd."""


@issue.command("node")
@click.argument("name")
@dir_option
@days_option
@not_before_option
def issue_node(name: str, directory: str, days: int, not_before: datetime | None) -> None:
    """A node agent's certificate: CN=NAME (the node id), O=llmgw:nodes."""
    _issue(directory, "node", name, days=days, not_before=not_before)


@issue.command("admin")
@click.argument("name")
@dir_option
@days_option
@not_before_option
@click.option("--write-config", is_flag=True, help="Also write the client configuration for this admin.")
@click.option("--server", default="https://127.0.0.1:7443", show_default=True, help="Server URL for --write-config.")
@click.option("--config", "config", default=None,
              help="Where --write-config writes (default $LLMGW_CONFIG or ~/.config/llmgw/config.yaml).")
@click.option("--context", metavar="NAME",
              help="With --write-config: add this cluster to the config as context NAME, keeping its other "
                   "contexts (the current one too, or NAME when there was none); without it the file is "
                   "this one cluster.")
def issue_admin(name: str, directory: str, days: int, not_before: datetime | None, write_config: bool,
                server: str, config: str | None, context: str | None) -> None:
    """A person's certificate: O=llmgw:admins may do anything."""
    if context and not write_config:
        raise click.UsageError("--context names the context --write-config writes; add --write-config")
    entry = _issue(directory, "admin", name, days=days, not_before=not_before)
    if write_config:
        from llmgw.client import ClientConfig
        cfg = ClientConfig(server=server, ca=str(_ca(directory).cert_path), cert=entry.cert, key=entry.key)
        written = checked(lambda: cfg.save_context(context, config)) if context else cfg.save(config)
        click.echo(f"config written: {written}" + (f" (context {context!r})" if context else ""))


@issue.command("user")
@click.argument("name")
@click.option("--group", "groups", multiple=True, metavar="G", help="A group the user is in (its O); repeat it.")
@dir_option
@click.option("--days", type=int, default=USER_DAYS, show_default=True, help="Validity in days (short-lived).")
@not_before_option
def issue_user(name: str, groups: tuple[str, ...], directory: str, days: int, not_before: datetime | None) -> None:
    """A person's certificate: CN=NAME, an O per --group, OU=llmgw:users; it may do what the
    RoleBindings naming the user or its groups grant (README, "Giving people access")."""
    _issue(directory, "user", name, days=days, not_before=not_before, groups=groups)


@issue.command("component")
@click.argument("name", type=click.Choice(["controller-manager", "gateway"]))
@dir_option
@days_option
@not_before_option
def issue_component(name: str, directory: str, days: int, not_before: datetime | None) -> None:
    """A component's certificate: O=llmgw:components, CN controller-manager or gateway."""
    _issue(directory, "component", name, days=days, not_before=not_before)


@issue.command("server")
@click.option("--san", "sans", multiple=True, required=True, help="DNS name or IP address clients dial (repeatable).")
@click.option("--name", default="llmgw-server", show_default=True, help="Common name.")
@dir_option
@days_option
@not_before_option
def issue_server(sans: tuple[str, ...], name: str, directory: str, days: int,
                 not_before: datetime | None) -> None:
    """The API server's certificate."""
    _issue(directory, "server", name, sans=sans, days=days, not_before=not_before)


@issue.command("etcd-member")
@click.argument("name")
@click.option("--san", "sans", multiple=True, required=True,
              help="DNS name or IP address clients and peers dial this member at (repeatable).")
@dir_option
@days_option
@not_before_option
def issue_etcd_member(name: str, sans: tuple[str, ...], directory: str, days: int,
                      not_before: datetime | None) -> None:
    """An etcd member's certificate (etcd's --cert-file and --peer-cert-file), from the etcd CA."""
    _issue(directory, "etcd-member", name, sans=sans, days=days, not_before=not_before)


@issue.command("etcd-client")
@click.argument("name")
@dir_option
@days_option
@not_before_option
def issue_etcd_client(name: str, directory: str, days: int, not_before: datetime | None) -> None:
    """A client certificate for etcd, from the etcd CA: for the server and the controller-manager
    (their --etcd-cert). Never for a node or the gateway."""
    _issue(directory, "etcd-client", name, days=days, not_before=not_before)


@issue.command("signer")
@dir_option
@days_option
def issue_signer(directory: str, days: int) -> None:
    """The control plane's signing CA (signer.crt, signer.key in --dir), which the API servers
    renew nodes' and components' certificates with (`llmgw server --signer-cert --signer-key`);
    `llmgw ca init` makes the first, this a new one before it expires."""
    try:
        entry = _ca(directory).issue_signer(days)
    except CAError as err:
        _fail(err)
    click.echo(f"issued the signer: serial {entry.serial}, valid until {entry.not_after}")
    click.echo(f"  cert {entry.cert}")
    click.echo(f"  key  {entry.key} (copy both to every API server; restart them one at a time)")


@ca.command(epilog=EXIT_CODES_HELP)
@click.argument("serial", required=False)
@click.option("--node", default=None, help="Revoke every certificate issued to this node.")
@click.option("--replay", is_flag=True,
              help="Send every revocation of the CA's journal again (after etcd was restored from a snapshot).")
@dir_option
@connection_options
def revoke(serial: str | None, node: str | None, replay: bool, directory: str, conn: Connection) -> None:
    """Revoke SERIAL (or every certificate of --node) through the server, as an admin.

    The server records it under /llmgw/revoked/ and refuses the certificate from then on;
    nothing in the API takes a revocation back. Each revocation is first appended to the
    journal beside the CA (revocations.jsonl in --dir), which --replay sends again: etcd
    restored from a snapshot lacks the revocations made after it.
    """
    if [bool(serial), bool(node), replay].count(True) != 1:
        raise click.UsageError("give SERIAL, --node NAME or --replay")
    authority = _ca(directory)
    try:
        if replay:
            entries = authority.journaled()
        else:
            entries = authority.journal(authority.serials_of_node(node) if node else [normalize_serial(serial or "")])
    except CAError as err:
        _fail(err)

    renewals: dict[str, list[str]] = {}

    async def record() -> None:
        async with conn.client() as c:
            for e in entries:
                renewals[e.serial] = (await c.revoke(e.serial, role=e.role, name=e.name)).get("renewals") or []

    run(record())
    if authority.index_path.exists():
        authority.mark_revoked([e.serial for e in entries])
    for e in entries:
        renewed = renewals.get(e.serial)
        click.echo(f"{'replayed' if replay else 'revoked'} {e.serial}"
                   + (f" and its renewals {', '.join(renewed)}" if renewed else ""))
    if replay:
        click.echo(f"{len(entries)} revocation(s) of {authority.journal_path} replayed")


@ca.command("list")
@dir_option
def list_(directory: str) -> None:
    """Every certificate this CA issued."""
    authority = _ca(directory)
    if not authority.exists():
        _fail(CAError(f"no CA in {authority.dir}: run `llmgw ca init --dir {authority.dir}` first"))
    now = datetime.now(timezone.utc)
    rows = []
    etcd_index = authority.etcd().index() if (authority.dir / "etcd").exists() else []
    for e in authority.index() + etcd_index:
        state = "revoked" if e.revoked else ("expired" if datetime.fromisoformat(e.not_after) < now else "valid")
        rows.append([e.serial, e.role, e.name, e.not_after[:19], state])
    print_table(["SERIAL", "ROLE", "NAME", "NOT AFTER", "STATE"], rows)


@ca.command(epilog=EXIT_CODES_HELP)
@dir_option
@click.option("--file", "files", multiple=True, metavar="FILE",
              help="Another certificate file to list (a node's, where it renews its own); repeatable.")
@click.option("--cluster", is_flag=True,
              help="Also the newest certificate the cluster's servers renewed for each identity (as an admin, "
                   "through the connection options below).")
@connection_options
def status(directory: str, files: tuple[str, ...], cluster: bool, conn: Connection) -> None:
    """The certificates in use, soonest to expire first, with the days they have left: the roots,
    the signer, the last unrevoked certificate of each identity of --dir (read from its file,
    which a renewal rewrites), etcd's, each --file, and with --cluster the newest renewal of each
    identity the servers signed (its FILE column: "renewed")."""
    authority = _ca(directory)
    if not authority.exists():
        _fail(CAError(f"no CA in {authority.dir}: run `llmgw ca init --dir {authority.dir}` first"))
    found = authority.in_use()
    known = {path.resolve() for _, _, path in found}
    found += [("file", "", Path(f)) for f in files if Path(f).resolve() not in known]
    now = datetime.now(timezone.utc)
    rows: list[tuple[datetime, list[str]]] = []

    def row(role: str, name: str, serial: str, not_after: datetime, where: str) -> None:
        days = (not_after - now).total_seconds() / 86400
        rows.append((not_after, [role, name, serial, not_after.isoformat()[:19],
                                 f"{days:.1f}" if days > 0 else "expired", where]))

    for role, name, path in found:
        try:
            who = identity_from_pem_file(str(path))
        except (OSError, ValueError) as err:
            _fail(CAError(f"{path}: not a readable certificate: {getattr(err, 'strerror', None) or err}"))
        row(role if role != "file" else who.role or "?", name or who.name, who.serial, who.not_after, str(path))
    if cluster:
        async def renewed() -> list[dict[str, str]]:
            async with conn.client() as c:
                return await c.renewals()
        newest: dict[tuple[str, str], dict[str, str]] = {}
        for r in run(renewed()):
            key = (r["role"], r["name"])
            if key not in newest or r["notAfter"] > newest[key]["notAfter"]:
                newest[key] = r
        for (role, name), r in newest.items():
            row(role, name, r["serial"], datetime.fromisoformat(r["notAfter"]), "renewed")
    rows.sort(key=lambda r: r[0])
    print_table(["ROLE", "NAME", "SERIAL", "NOT AFTER", "DAYS LEFT", "FILE"], [r for _, r in rows])

"""Making a reachable host an llmgw node, over ssh, idempotently (the command: llmgw/cmd/onboard.py)."""
from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit

import click
from cryptography import x509

from llmgw.api import Node
from llmgw.api.errors import NotFound
from llmgw.api.fabrics import FabricError, FabricSpec
from llmgw.api.meta import check_dns1123_label
from llmgw.onboarding.artifact import inspect
from llmgw.onboarding.identity import node_identity
from llmgw.onboarding.remote_install import (
    Layout,
    RemoteHost,
    ServiceManager,
    render_config,
    render_unit,
    service_manager,
)
from llmgw.onboarding.ssh import Ssh
from llmgw.pki import identity_from_cert

Echo = Callable[[str], object]  # click.echo, or a test's collector


class OnboardError(Exception):
    pass


def _check_inputs(node: str, server: str, fabrics: tuple[str, ...]) -> None:
    from llmgw.client.config import server_urls
    try:
        check_dns1123_label(node)
    except ValueError as err:
        raise OnboardError(f"--node: {err}") from None
    for each in server_urls(server) or [server]:
        url = urlsplit(each)
        if url.scheme != "https" or not url.hostname:
            raise OnboardError(f"--server {each!r}: give the server's URL, e.g. https://10.0.0.1:7443")
    for spec in fabrics:
        try:
            FabricSpec.parse(spec)
        except (FabricError, ValueError) as err:
            raise OnboardError(f"--fabric {spec!r}: {err}") from None


def _check_not_another_node(cert_pem: bytes, node: str, addr: str, layout: Layout) -> None:
    """Never adopt: a host that holds another node's certificate stays that node."""
    try:
        holder = identity_from_cert(x509.load_pem_x509_certificate(cert_pem)).name
    except ValueError:
        return      # unreadable: replaced like any stale file
    if holder != node:
        raise OnboardError(f"{addr} is already another node: its certificate {layout.cert} has CN={holder!r}. "
                           f"Refusing to make it {node!r}: onboard it as {holder!r}, or remove "
                           f"{layout.path('etc/llmgw')} there (and revoke {holder}'s certificate) first")


def install(opts: dict[str, Any], echo: Echo = click.echo) -> tuple[RemoteHost, ServiceManager]:
    """Every step up to a running agent; returns the host and its service manager."""
    node = opts["node"]
    _check_inputs(node, opts["server"], opts["fabrics"])
    artifact = inspect(opts["binary"]) if opts["binary"] else None

    ssh = Ssh(opts["addr"], user=opts["ssh_user"], port=opts["ssh_port"], identity=opts["ssh_identity"],
              known_hosts=opts["ssh_known_hosts"])
    layout = Layout(opts["root"])
    host = RemoteHost(ssh, layout, log=echo)
    trust_paths = [layout.trust_anchor(s) for s in ("debian", "rhel")]
    facts = host.probe([layout.binary, layout.config, layout.ca, layout.cert, layout.key, layout.unit, *trust_paths])
    echo(f"host {opts['addr']}: {facts.machine}, python {facts.python or 'absent'}, "
         f"trust store {facts.trust or 'unknown'}, systemd {'yes' if facts.systemd else 'no'}")

    if facts.node_cert is not None:
        _check_not_another_node(facts.node_cert, node, opts["addr"], layout)
    if facts.python is None or tuple(map(int, facts.python.split("."))) < (3, 11):
        raise OnboardError(f"{opts['addr']} has python3 {facts.python or 'missing'}; the llmgw artifact needs "
                           "Python 3.11 or later (Debian 12, Ubuntu 24.04, RHEL 9 with python3.11)")
    if artifact is not None:
        artifact.check_runs_on(facts.machine, facts.python)
    sm = service_manager(opts["service_manager"], host)

    ident = node_identity(opts["ca_dir"], node, opts["cert"], opts["key"])
    echo(f"certificate: CN={node} serial {ident.serial} ({'issued now' if ident.issued_now else 'already issued'})")

    echo("installing:")
    changed = False
    if artifact is not None:
        changed |= host.put(layout.binary, artifact.path.read_bytes(), 0o755)
    elif layout.binary not in facts.files:
        raise OnboardError(f"no llmgw at {layout.binary} on {opts['addr']}: pass --binary "
                           "dist/llmgw-VERSION-linux-ARCH.pex (hack/release.sh builds it)")
    changed |= host.put(layout.ca, ident.ca_pem, 0o644)
    changed |= host.put(layout.cert, ident.cert_pem, 0o644)
    changed |= host.put(layout.key, ident.key_pem, 0o600)
    host.trust_root(ident.ca_pem, facts.trust)
    config = render_config(layout, node, opts["server"], list(opts["fabrics"]), opts["nvidia_smi"], opts["ib_root"],
                           opts["logs_listen"])
    changed |= host.put(layout.config, config, 0o644)
    changed |= host.put(layout.unit, render_unit(layout), 0o644)
    echo(f"agent ({sm.name}): {sm.apply(changed)}")
    return host, sm


async def _wait_for_node(opts: dict[str, Any], timeout: float) -> Node:
    from llmgw.client import ApiError, Client, ClientConfig
    cfg = ClientConfig.load(opts["config"])
    last = ""
    deadline = time.monotonic() + timeout
    async with Client(opts["server"], ca=cfg.ca, cert=cfg.cert, key=cfg.key) as client:
        while True:
            try:
                return await client.get(Node, opts["node"])
            except NotFound:
                last = "not registered yet"
            except ApiError as err:
                last = str(err)
            if time.monotonic() > deadline:
                raise TimeoutError(last)
            await asyncio.sleep(1)


def wait_for_node(opts: dict[str, Any], sm: ServiceManager, echo: Echo = click.echo) -> None:
    timeout = opts["wait"]
    echo(f"waiting up to {timeout:.0f}s for node {opts['node']} to register with {opts['server']} ...")
    try:
        node = asyncio.run(_wait_for_node(opts, timeout))
    except TimeoutError as err:
        tail = sm.tail().rstrip()
        raise OnboardError("\n".join([
            f"node {opts['node']} did not appear in {opts['server']} within {timeout:.0f}s (last answer: {err}).",
            "Likely causes:",
            f"  - the agent is not running or keeps failing: see {sm.logs_hint()}",
            f"  - the node cannot reach {opts['server']} (address, DNS, firewall on the server's port)",
            "  - the server refused the node's certificate (CN must be the node id; revoked serial; another CA):",
            "    the server's log says why, naming which certificate CN claimed which node",
            *(["last lines of the agent's log:", *("    " + line for line in tail.splitlines())] if tail else []),
        ])) from None
    from llmgw.printers.kinds import table
    from llmgw.printers.table import format_table
    echo(format_table(*table(Node, [node], wide=True)))

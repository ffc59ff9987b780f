"""The etcd TLS options of every command that talks to etcd (server, controller-manager)."""
from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TypeVar

import click

etcd_tls_options = [
    click.option("--etcd-ca", envvar="LLMGW_ETCD_CA", type=click.Path(exists=True, dir_okay=False),
                 help="CA of etcd's certificate (the etcd CA's ca.crt) for https endpoints; or $LLMGW_ETCD_CA."),
    click.option("--etcd-cert", envvar="LLMGW_ETCD_CERT", type=click.Path(exists=True, dir_okay=False),
                 help="Client certificate for etcd (`llmgw ca issue etcd-client`); or $LLMGW_ETCD_CERT."),
    click.option("--etcd-key", envvar="LLMGW_ETCD_KEY", type=click.Path(exists=True, dir_okay=False),
                 help="Its private key; or $LLMGW_ETCD_KEY."),
]


F = TypeVar("F", bound=Callable[..., object])


def etcd_tls(fn: F) -> F:
    """The --etcd-ca/--etcd-cert/--etcd-key options of every command that talks to etcd."""
    for option in reversed(etcd_tls_options):
        fn = option(fn)
    return fn


def etcd_wait(fn: F) -> F:
    """--etcd-wait: how long a starting component waits for etcd to answer."""
    return click.option(
        "--etcd-wait", type=click.FloatRange(min=0), default=60.0, show_default=True,
        help="Seconds to wait at startup for etcd to answer (restarting, or without a quorum) before "
             "giving up with one line naming the endpoints; 0: give up at once.")(fn)


def warn_unless_tls(endpoints: str, cert: str | None, log: logging.Logger) -> None:
    """One warning at startup when etcd is reached without TLS and a client certificate."""
    plain = [e for e in endpoints.split(",") if not e.strip().startswith("https://")]
    if plain or not cert:
        log.warning("etcd %s without %s: whoever reaches etcd can rewrite what nodes run and un-revoke "
                    "certificates; see README, \"Production security\"", ",".join(plain) or endpoints,
                    "TLS" if plain else "a client certificate (--etcd-cert)")

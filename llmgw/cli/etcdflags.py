"""The etcd TLS options of every command that talks to etcd (server, controller-manager, ca revoke)."""
from __future__ import annotations

import click

etcd_tls_options = [
    click.option("--etcd-ca", envvar="LLMGW_ETCD_CA", type=click.Path(exists=True, dir_okay=False),
                 help="CA of etcd's certificate (the etcd CA's ca.crt) for https endpoints; or $LLMGW_ETCD_CA."),
    click.option("--etcd-cert", envvar="LLMGW_ETCD_CERT", type=click.Path(exists=True, dir_okay=False),
                 help="Client certificate for etcd (`llmgw ca issue etcd-client`); or $LLMGW_ETCD_CERT."),
    click.option("--etcd-key", envvar="LLMGW_ETCD_KEY", type=click.Path(exists=True, dir_okay=False),
                 help="Its private key; or $LLMGW_ETCD_KEY."),
]


def etcd_tls(fn):
    """The --etcd-ca/--etcd-cert/--etcd-key options of every command that talks to etcd."""
    for option in reversed(etcd_tls_options):
        fn = option(fn)
    return fn

"""`llmgw-onboard-node`: make a reachable host an llmgw node, over ssh, idempotently (llmgw.onboarding)."""
from __future__ import annotations

import sys
from typing import Any

import click

from llmgw.onboarding.artifact import ArtifactError
from llmgw.onboarding.identity import IdentityError
from llmgw.onboarding.onboard import OnboardError, install, wait_for_node
from llmgw.onboarding.remote_install import SERVICE_MANAGERS, InstallError
from llmgw.onboarding.ssh import SshError

HELP = """Make the host at ADDR an llmgw node named NODE, over ssh.

\b
Steps, each skipped when already done (running it twice is safe):
  1. the node certificate (CN = NODE): reused from the CA directory when it
     holds a valid one, else issued (or --cert/--key, checked against NODE);
  2. over ssh: certificate, key (0600) and CA root under /etc/llmgw/pki; the
     root trusted system-wide (update-ca-certificates or update-ca-trust,
     detected); the release artifact as /usr/local/bin/llmgw; the agent
     configuration /etc/llmgw/agent.yaml; the systemd unit;
  3. the agent enabled and started (restarted only when something changed);
  4. waits until the Node appears in the server and prints its row.

A host that already holds another node's certificate is refused.

\b
--service-manager: systemd (default) runs `systemctl enable/restart
llmgw-agent`. direct is for hosts without an init system (containers,
tests): the agent runs under nohup, its pid in /run/llmgw-agent.pid and its
log in /var/log/llmgw-agent.log (both under --root).

--root installs everything under another directory of the host (tests use a
throwaway one); the trust store update then works on that directory's copy.
"""


@click.command("llmgw-onboard-node", help=HELP, context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--node", required=True, help="Node id: the Node's name and the certificate's CN (a DNS label).")
@click.option("--addr", required=True, help="Address (or host name) ssh reaches the host at.")
@click.option("--server", required=True, multiple=True,
              help="llmgw server URL as the node reaches it, e.g. https://10.0.0.1:7443; repeatable or "
                   "comma-separated: every API server (the agent moves to the next when one goes away).")
@click.option("--fabric", "fabrics", multiple=True, metavar="NAME[:ADAPTER,...]",
              help="Fabric the node is cabled to (the agent's --fabric); repeatable.")
@click.option("--nvidia-smi", help="nvidia-smi path on the node (default: the agent's).")
@click.option("--ib-root", help="InfiniBand sysfs root on the node (default /sys/class/infiniband).")
@click.option("--logs-listen", default="0.0.0.0:10250", show_default=True, metavar="HOST:PORT",
              help="Where the agent serves its engine logs to the API server (`llmgw logs`; the agent's "
                   "logs-listen); '' to serve none.")
@click.option("--binary", type=click.Path(dir_okay=False),
              help="Release artifact to install (hack/release.sh: dist/llmgw-VERSION-linux-ARCH.pex). "
                   "Without it the host must already have /usr/local/bin/llmgw.")
@click.option("--ssh-user", default="root", show_default=True, help="Login user; others use `sudo -n`.")
@click.option("--ssh-port", default=22, show_default=True, type=int)
@click.option("--ssh-identity", type=click.Path(dir_okay=False), help="Private key for ssh (default: ssh's own).")
@click.option("--ssh-known-hosts", type=click.Path(dir_okay=False),
              help="known_hosts file (default ~/.ssh/known_hosts); a new host key is accepted on first use.")
@click.option("--ca-dir", envvar="LLMGW_CA_DIR", default="~/.config/llmgw/ca", show_default=True,
              help="The CA directory (`llmgw ca init`), or $LLMGW_CA_DIR.")
@click.option("--cert", type=click.Path(dir_okay=False), help="Use this node certificate instead (CN must be NODE).")
@click.option("--key", type=click.Path(dir_okay=False), help="Its key.")
@click.option("--root", envvar="LLMGW_INSTALL_ROOT", default="/", show_default=True,
              help="Install under this directory of the host (or $LLMGW_INSTALL_ROOT).")
@click.option("--service-manager", type=click.Choice(sorted(SERVICE_MANAGERS)), default="systemd",
              show_default=True, help="How the agent is run (see above).")
@click.option("--config", "config", default=None,
              help="Admin client configuration used to watch for the Node (default $LLMGW_CONFIG or "
                   "~/.config/llmgw/config.yaml).")
@click.option("--wait", default=120.0, show_default=True, type=float,
              help="Seconds to wait for the Node to register; 0: do not wait.")
def main(**opts: Any) -> None:
    from llmgw.client import ClientConfig, ConfigError
    opts["server"] = ",".join(opts["server"])   # the agent's config takes them comma-separated
    try:
        if opts["wait"] > 0:
            ClientConfig.load(opts["config"])     # before any change: waiting needs admin credentials
        _host, sm = install(opts)
        if opts["wait"] > 0:
            wait_for_node(opts, sm)
    except (OnboardError, IdentityError, ArtifactError, InstallError, SshError, ConfigError) as err:
        click.echo(f"llmgw-onboard-node: {err}", err=True)
        sys.exit(1)

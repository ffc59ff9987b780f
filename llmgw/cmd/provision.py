"""`llmgw-provision-node`: create a node VM on Proxmox VE from a cloud image."""
from __future__ import annotations

import ipaddress
import shlex
import sys
from pathlib import Path

import click

from llmgw.api.meta import check_dns1123_label
from llmgw.onboarding.artifact import ArtifactError, inspect
from llmgw.onboarding.proxmox import Proxmox, ProxmoxError, VmSpec, check_vmid_command, plan
from llmgw.onboarding.remote_install import Layout, RemoteHost
from llmgw.onboarding.ssh import Ssh, SshError

DEFAULT_IMAGE = "/var/lib/vz/import/debian-12-genericcloud-amd64.qcow2"

HELP = """Create VM VMID on this Proxmox VE host from a cloud image, ready to onboard.

\b
The VM name, the guest's host name (Proxmox's cloud-init uses the VM name)
and the llmgw node id are one string, NAME: a NAME that is not a valid node
id (a DNS-1123 label) is refused. A VMID that exists anywhere in the cluster
is refused (`pvesh get /cluster/nextid --vmid N`): this never adopts a machine.

\b
cloud-init gets the address (--ip, --gateway), the login user (--ci-user)
and the public keys of --ssh-keys: by default this host's own
~/.ssh/authorized_keys, so whoever can reach this host (the CA host) can
reach the VM and run llmgw-onboard-node.

--binary takes a release artifact (hack/release.sh) and copies it to the VM's
/usr/local/bin/llmgw once it answers ssh; an llmgw installed on this machine
is refused, since it only runs in its own virtualenv.

--dry-run prints the exact pvesh/qm commands and runs nothing.
"""


def _default_keys() -> str:
    return str(Path("~/.ssh/authorized_keys").expanduser())


def _check_keys(path: str) -> None:
    p = Path(path)
    if not p.is_file():
        raise click.UsageError(f"--ssh-keys {path}: no such file; give a file of public keys")
    keys = [ln for ln in p.read_text().splitlines() if ln.strip() and not ln.lstrip().startswith("#")]
    if not keys:
        raise click.UsageError(f"--ssh-keys {path} holds no public key: nobody could log into the VM")


@click.command("llmgw-provision-node", help=HELP, context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--vmid", required=True, type=int, help="Proxmox VMID; must be free cluster-wide.")
@click.option("--name", required=True, help="VM name = host name = node id (a DNS-1123 label).")
@click.option("--ip", required=True, metavar="CIDR", help="Address with prefix, e.g. 10.0.0.144/24.")
@click.option("--gateway", metavar="IP", help="Default gateway (inside --ip's network).")
@click.option("--image", default=DEFAULT_IMAGE, show_default=True, help="Cloud image to import as the boot disk.")
@click.option("--storage", default="local-lvm", show_default=True, help="Storage for the disk and cloud-init drive.")
@click.option("--bridge", default="vmbr0", show_default=True)
@click.option("--cores", default=4, show_default=True, type=int)
@click.option("--memory", default=8192, show_default=True, type=int, help="MB.")
@click.option("--disk-size", metavar="SIZE", help="Grow the boot disk to SIZE (e.g. 64G).")
@click.option("--gpu", "gpus", multiple=True, metavar="PCI",
              help="PCI address of a GPU to pass through (e.g. 41:00); repeatable. Sets machine q35.")
@click.option("--binary", type=click.Path(dir_okay=False), help="Release artifact to install in the VM.")
@click.option("--ssh-keys", default=None, help="Public keys for the VM [default: ~/.ssh/authorized_keys].")
@click.option("--ci-user", default="root", show_default=True, help="cloud-init login user.")
@click.option("--ssh-wait", default=300, show_default=True, type=int,
              help="With --binary: seconds to wait for the VM's ssh.")
@click.option("--ssh-identity", type=click.Path(dir_okay=False), help="With --binary: ssh private key to use.")
@click.option("--dry-run", is_flag=True, help="Print the commands; run nothing.")
def main(vmid: int, name: str, ip: str, gateway: str | None, image: str, storage: str, bridge: str, cores: int,
         memory: int, disk_size: str | None, gpus: tuple[str, ...], binary: str | None, ssh_keys: str | None,
         ci_user: str, ssh_wait: int, ssh_identity: str | None, dry_run: bool) -> None:
    try:
        check_dns1123_label(name)
    except ValueError as err:
        raise click.BadParameter(f"{err}; it becomes the VM name, the host name and the node id",
                                 param_hint="--name") from None
    ssh_keys = ssh_keys or _default_keys()
    spec = VmSpec(vmid=vmid, name=name, ip=ip, image=image, ssh_keys=ssh_keys, gateway=gateway, storage=storage,
                  bridge=bridge, cores=cores, memory=memory, disk_size=disk_size, gpus=tuple(gpus), ci_user=ci_user)
    try:
        spec.validate()
        artifact = inspect(binary) if binary else None
    except (ProxmoxError, ArtifactError) as err:
        raise click.UsageError(str(err)) from None
    commands = [check_vmid_command(vmid), *plan(spec)]
    if dry_run:
        for cmd in commands:
            click.echo(shlex.join(cmd))
        if artifact:
            click.echo(f"# then, once {ci_user}@{ip.split('/')[0]} answers ssh: install {artifact.path} "
                       f"as /usr/local/bin/llmgw")
        return
    _check_keys(ssh_keys)
    if not Path(image).is_file():
        raise click.UsageError(f"--image {image}: no such file on this host; download the cloud image "
                               "(e.g. Debian's genericcloud qcow2) first")
    pve = Proxmox()
    try:
        pve.check_vmid_free(vmid)
    except ProxmoxError as err:
        click.echo(f"llmgw-provision-node: {err}", err=True)
        sys.exit(1)
    created = False
    try:
        for cmd in plan(spec):
            click.echo(f"+ {shlex.join(cmd)}")
            pve.run(cmd)
            created = True
    except ProxmoxError as err:
        click.echo(f"llmgw-provision-node: {err}", err=True)
        if created:   # this run created the VM: remove it, so a retry starts clean
            click.echo(f"removing VM {vmid}, which this run created", err=True)
            try:
                pve.run(["qm", "destroy", str(vmid), "--purge"])
            except ProxmoxError as cleanup:
                click.echo(f"llmgw-provision-node: could not remove VM {vmid}: {cleanup}", err=True)
        sys.exit(1)
    address = str(ipaddress.ip_interface(ip).ip)
    if artifact:
        ssh = Ssh(address, user=ci_user, identity=ssh_identity)
        try:
            click.echo(f"waiting up to {ssh_wait}s for {ssh.target} to answer ssh ...")
            ssh.wait_reachable(ssh_wait)
            host = RemoteHost(ssh, Layout("/"))
            host.probe([host.layout.binary])
            facts = host.facts
            assert facts is not None  # probe() read them
            if facts.python:
                artifact.check_runs_on(facts.machine, facts.python)
            host.put(host.layout.binary, artifact.path.read_bytes(), 0o755)
        except (SshError, ArtifactError) as err:
            click.echo(f"llmgw-provision-node: VM {vmid} is running, but installing the binary failed: {err}",
                       err=True)
            sys.exit(1)
    click.echo(f"VM {vmid} ({name}) started at {address}. Next, from the CA host:\n"
               f"  llmgw-onboard-node --node {name} --addr {address} --server https://SERVER:7443"
               + ("" if artifact else " --binary dist/llmgw-VERSION-linux-ARCH.pex"))

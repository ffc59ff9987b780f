"""The Proxmox VE commands that create a node VM from a cloud image.

`plan()` is pure: it turns a VmSpec into the exact `qm` commands, in order.
`Proxmox` runs `pvesh`/`qm` (whatever is first on PATH) and turns their
failures into messages that say which command failed and what it printed.
"""
from __future__ import annotations

import ipaddress
import re
import shlex
import subprocess
from dataclasses import dataclass, field


class ProxmoxError(Exception):
    def __init__(self, message: str, said: str = ""):
        super().__init__(message)
        self.said = said            # the failing command's last line of output


_PCI = re.compile(r"^(?:[0-9a-fA-F]{4}:)?[0-9a-fA-F]{2}:[0-9a-fA-F]{2}(?:\.[0-7])?$")
_SIZE = re.compile(r"^\+?\d+[KMGT]?$")


@dataclass(frozen=True)
class VmSpec:
    vmid: int
    name: str
    ip: str                     # CIDR, e.g. 10.0.0.144/24
    image: str
    ssh_keys: str               # a file of public keys (authorized_keys format)
    gateway: str | None = None
    storage: str = "local-lvm"
    bridge: str = "vmbr0"
    cores: int = 4
    memory: int = 8192
    disk_size: str | None = None
    gpus: tuple[str, ...] = field(default_factory=tuple)
    ci_user: str = "root"

    def validate(self) -> None:
        if not 100 <= self.vmid <= 999_999_999:
            raise ProxmoxError(f"VMID {self.vmid} is out of range (Proxmox accepts 100 to 999999999)")
        try:
            iface = ipaddress.ip_interface(self.ip)
        except ValueError:
            raise ProxmoxError(f"--ip {self.ip!r} is not an address with a prefix, e.g. 10.0.0.144/24") from None
        if "/" not in self.ip:
            raise ProxmoxError(f"--ip {self.ip!r} needs a prefix length, e.g. {self.ip}/24")
        if self.gateway is not None:
            try:
                gw = ipaddress.ip_address(self.gateway)
            except ValueError:
                raise ProxmoxError(f"--gateway {self.gateway!r} is not an IP address") from None
            if gw not in iface.network:
                raise ProxmoxError(f"--gateway {gw} is outside {iface.network}, the network of --ip {self.ip}")
        for pci in self.gpus:
            if not _PCI.match(pci):
                raise ProxmoxError(f"--gpu {pci!r} is not a PCI address like 41:00 or 0000:41:00.0 (see lspci)")
        if self.disk_size is not None and not _SIZE.match(self.disk_size):
            raise ProxmoxError(f"--disk-size {self.disk_size!r}: give a size like 64G")
        if self.cores < 1 or self.memory < 512:
            raise ProxmoxError("a VM needs at least 1 core and 512 MB of memory")


def check_vmid_command(vmid: int) -> list[str]:
    return ["pvesh", "get", "/cluster/nextid", "--vmid", str(vmid)]


def plan(spec: VmSpec) -> list[list[str]]:
    """The qm commands that create and start the VM, in order (the VMID check comes before)."""
    n = str(spec.vmid)
    ipconfig = f"ip={spec.ip}" + (f",gw={spec.gateway}" if spec.gateway else "")
    cmds = [
        # The VM name is what Proxmox's cloud-init gives the guest as its hostname.
        ["qm", "create", n, "--name", spec.name, "--memory", str(spec.memory), "--cores", str(spec.cores),
         "--cpu", "host", "--net0", f"virtio,bridge={spec.bridge}", "--scsihw", "virtio-scsi-pci"],
        ["qm", "set", n, "--scsi0", f"{spec.storage}:0,import-from={spec.image}"],
    ]
    if spec.disk_size:
        cmds.append(["qm", "resize", n, "scsi0", spec.disk_size])
    cmds += [
        ["qm", "set", n, "--ide2", f"{spec.storage}:cloudinit", "--boot", "order=scsi0",
         "--serial0", "socket", "--vga", "serial0"],
        ["qm", "set", n, "--ciuser", spec.ci_user, "--sshkeys", spec.ssh_keys, "--ipconfig0", ipconfig],
    ]
    if spec.gpus:
        gpu_args = ["--machine", "q35"]
        for i, pci in enumerate(spec.gpus):
            gpu_args += [f"--hostpci{i}", f"{pci},pcie=on"]
        cmds.append(["qm", "set", n, *gpu_args])
    cmds.append(["qm", "start", n])
    return cmds


class Proxmox:
    def __init__(self, timeout: float = 600):
        self.timeout = timeout

    def run(self, cmd: list[str]) -> str:
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=self.timeout)
        except FileNotFoundError:
            raise ProxmoxError(f"{cmd[0]} not found: run this on a Proxmox VE host (or put qm and pvesh on PATH)") \
                from None
        except subprocess.TimeoutExpired:
            raise ProxmoxError(f"`{shlex.join(cmd)}` did not finish within {self.timeout:.0f}s") from None
        if proc.returncode != 0:
            said = (proc.stderr.strip() or proc.stdout.strip() or "no output").splitlines()[-1]
            raise ProxmoxError(f"`{shlex.join(cmd)}` failed (exit {proc.returncode}): {said}", said)
        return proc.stdout

    def check_vmid_free(self, vmid: int) -> None:
        """Refuse a VMID that exists anywhere in the cluster (qm only sees the local node's VMs)."""
        cmd = check_vmid_command(vmid)
        try:
            self.run(cmd)
        except ProxmoxError as err:
            if "already exists" in err.said:
                raise ProxmoxError(f"refusing VMID {vmid}: {err.said}. llmgw never adopts an existing machine: "
                                   f"choose a free VMID (`pvesh get /cluster/nextid` suggests one)") from None
            raise

"""llmgw-provision-node against a fake qm/pvesh (hack/fakes/proxmox) that records every call."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
FAKES = ROOT / "hack" / "fakes" / "proxmox"
SCRIPT = Path(sys.executable).with_name("llmgw-provision-node")


@pytest.fixture
def pve(tmp_path):
    state = tmp_path / "pve"
    (state / "vms").mkdir(parents=True)
    image = tmp_path / "debian-12-genericcloud-amd64.qcow2"
    image.write_bytes(b"QFI\xfb not really an image")
    keys = tmp_path / "authorized_keys"
    keys.write_text("ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIHqkP5d4Sx0lHUW/4Lhwc3Jf9d6/lHTz9OKY2Qz0yH3a ops@ca\n")

    class Pve:
        dir = state

        def run(self, *args: str, **env: str) -> subprocess.CompletedProcess:
            argv = [str(SCRIPT)] if SCRIPT.exists() else \
                [sys.executable, "-c", "from llmgw.cmd.provision import main; main()"]
            environ = {**os.environ, "PATH": f"{FAKES}:{os.environ['PATH']}", "FAKE_PROXMOX_DIR": str(state),
                       "HOME": str(tmp_path), **env}
            return subprocess.run([*argv, *args], capture_output=True, text=True, env=environ, timeout=60)

        def calls(self) -> list[list[str]]:
            log = state / "calls.log"
            return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []

        def vm(self, vmid: int) -> dict[str, str]:
            f = state / "vms" / str(vmid)
            return dict(ln.split(" ", 1) for ln in f.read_text().splitlines()) if f.exists() else {}

        def add_vm(self, vmid: int, node: str) -> None:
            (state / "vms" / str(vmid)).write_text(f"node {node}\nstatus running\n")

    p = Pve()
    p.image, p.keys = str(image), str(keys)
    return p


def base_args(pve, vmid=120, name="gpu-07"):
    return ["--vmid", str(vmid), "--name", name, "--ip", "10.0.0.144/24", "--gateway", "10.0.0.1",
            "--image", pve.image, "--ssh-keys", pve.keys]


def test_creates_vm_with_exact_command_sequence(pve):
    res = pve.run(*base_args(pve), "--storage", "tank", "--bridge", "vmbr1", "--cores", "16",
                  "--memory", "65536", "--disk-size", "200G", "--gpu", "41:00", "--gpu", "0000:c1:00.0")
    assert res.returncode == 0, res.stderr
    assert pve.calls() == [
        ["pvesh", "get", "/cluster/nextid", "--vmid", "120"],
        ["qm", "create", "120", "--name", "gpu-07", "--memory", "65536", "--cores", "16", "--cpu", "host",
         "--net0", "virtio,bridge=vmbr1", "--scsihw", "virtio-scsi-pci"],
        ["qm", "set", "120", "--scsi0", f"tank:0,import-from={pve.image}"],
        ["qm", "resize", "120", "scsi0", "200G"],
        ["qm", "set", "120", "--ide2", "tank:cloudinit", "--boot", "order=scsi0", "--serial0", "socket",
         "--vga", "serial0"],
        ["qm", "set", "120", "--ciuser", "root", "--sshkeys", pve.keys, "--ipconfig0", "ip=10.0.0.144/24,gw=10.0.0.1"],
        ["qm", "set", "120", "--machine", "q35", "--hostpci0", "41:00,pcie=on", "--hostpci1", "0000:c1:00.0,pcie=on"],
        ["qm", "start", "120"],
    ]
    vm = pve.vm(120)
    # VM name = cloud-init host name = node id: one string.
    assert vm["name"] == "gpu-07" and vm["status"] == "running"
    assert "llmgw-onboard-node --node gpu-07 --addr 10.0.0.144" in res.stdout


def test_defaults_use_this_hosts_authorized_keys(pve, tmp_path):
    ssh_dir = tmp_path / ".ssh"
    ssh_dir.mkdir()
    (ssh_dir / "authorized_keys").write_text(Path(pve.keys).read_text())
    args = [a for a in base_args(pve) if a not in ("--ssh-keys", pve.keys)]
    res = pve.run(*args)
    assert res.returncode == 0, res.stderr
    ci = [c for c in pve.calls() if "--ciuser" in c]
    assert ci == [["qm", "set", "120", "--ciuser", "root", "--sshkeys", str(ssh_dir / "authorized_keys"),
                   "--ipconfig0", "ip=10.0.0.144/24,gw=10.0.0.1"]]
    assert not any("--hostpci0" in c or c[1] == "resize" for c in pve.calls())


def test_refuses_vmid_that_exists_on_another_cluster_node(pve):
    pve.add_vm(120, "pve3")     # not local: `qm status 120` here would not see it
    res = pve.run(*base_args(pve))
    assert res.returncode == 1
    assert "refusing VMID 120" in res.stderr and "already exists on node 'pve3'" in res.stderr
    assert "never adopts" in res.stderr
    assert pve.calls() == [["pvesh", "get", "/cluster/nextid", "--vmid", "120"]]   # nothing else ran
    assert pve.vm(120) == {"node": "pve3", "status": "running"}


@pytest.mark.parametrize("name", ["GPU-07", "gpu_07", "-gpu", "a" * 64, "gpu.07"])
def test_refuses_name_that_is_not_a_node_id(pve, name):
    res = pve.run(*base_args(pve, name=name))
    assert res.returncode == 2
    assert "DNS-1123" in res.stderr and "node id" in res.stderr
    assert pve.calls() == []


def test_dry_run_prints_exact_commands_and_runs_none(pve):
    res = pve.run(*base_args(pve), "--dry-run")
    assert res.returncode == 0, res.stderr
    assert pve.calls() == []
    lines = res.stdout.splitlines()
    assert lines[0] == "pvesh get /cluster/nextid --vmid 120"
    assert lines[1] == ("qm create 120 --name gpu-07 --memory 8192 --cores 4 --cpu host "
                        "--net0 virtio,bridge=vmbr0 --scsihw virtio-scsi-pci")
    assert lines[-1] == "qm start 120"
    assert f"qm set 120 --ciuser root --sshkeys {pve.keys} --ipconfig0 ip=10.0.0.144/24,gw=10.0.0.1" in lines


def test_failed_step_removes_the_vm_this_run_created(pve):
    res = pve.run(*base_args(pve), FAKE_PROXMOX_FAIL="qm set 120 --scsi0")
    assert res.returncode == 1
    assert "qm set 120 --scsi0" in res.stderr and "fake failure" in res.stderr
    assert [c[:2] for c in pve.calls()] == [["pvesh", "get"], ["qm", "create"], ["qm", "set"], ["qm", "destroy"]]
    assert pve.vm(120) == {}
    # and a retry starts clean with the same VMID
    assert pve.run(*base_args(pve)).returncode == 0


def test_binary_must_be_a_release_artifact(pve, tmp_path):
    script = tmp_path / "llmgw"      # what pip installs: a script bound to the operator's virtualenv
    script.write_text(f"#!{sys.executable}\nimport sys\nfrom llmgw.cli.main import cli\nsys.exit(cli())\n")
    script.chmod(0o755)
    res = pve.run(*base_args(pve), "--binary", str(script), "--dry-run")
    assert res.returncode == 2
    assert "not an llmgw release artifact" in res.stderr and "hack/release.sh" in res.stderr
    assert pve.calls() == []


@pytest.mark.parametrize("args, message", [
    (["--ip", "10.0.0.144"], "needs a prefix length"),
    (["--gateway", "192.168.1.1"], "outside 10.0.0.0/24"),
    (["--gpu", "gpu0"], "not a PCI address"),
    (["--vmid", "7"], "out of range"),
])
def test_refuses_bad_settings_before_any_call(pve, args, message):
    res = pve.run(*base_args(pve), *args)
    assert res.returncode == 2
    assert message in res.stderr
    assert pve.calls() == []


def test_missing_image_is_refused_before_any_call(pve):
    res = pve.run(*base_args(pve), "--image", "/nonexistent/cloud.img")
    assert res.returncode == 2 and "no such file" in res.stderr
    assert pve.calls() == []

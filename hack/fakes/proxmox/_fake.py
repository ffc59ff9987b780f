"""Shared code of the fake `qm` and `pvesh` (Proxmox VE) used by tests.

Environment:
  FAKE_PROXMOX_DIR   state directory (required): calls.log gets one JSON array
                     per call (argv, program first); vms/<vmid> holds the node
                     a VM lives on and its settings, one `key value` a line.
  FAKE_PROXMOX_NODE  the node these commands run on (default pve1).
  FAKE_PROXMOX_FAIL  "qm set --scsi0": a call whose argv (joined by spaces)
                     starts with this fails with exit 255, like a failed import.
Pre-existing VMs (on any cluster node) are files vms/<vmid> with `node NAME`.
"""
import json
import os
import sys
from pathlib import Path


def state() -> Path:
    d = os.environ.get("FAKE_PROXMOX_DIR")
    if not d:
        sys.exit("fake proxmox: FAKE_PROXMOX_DIR is not set")
    p = Path(d)
    (p / "vms").mkdir(parents=True, exist_ok=True)
    return p


def record(argv: list[str]) -> None:
    with open(state() / "calls.log", "a") as f:
        f.write(json.dumps(argv) + "\n")
    fail = os.environ.get("FAKE_PROXMOX_FAIL")
    if fail and " ".join(argv).startswith(fail):
        sys.stderr.write(f"fake failure of: {' '.join(argv)}\n")
        sys.exit(255)


def local_node() -> str:
    return os.environ.get("FAKE_PROXMOX_NODE", "pve1")


def vm_file(vmid: str) -> Path:
    return state() / "vms" / vmid


def vm_settings(vmid: str) -> dict[str, str]:
    f = vm_file(vmid)
    if not f.exists():
        return {}
    return dict(line.split(" ", 1) for line in f.read_text().splitlines() if " " in line)


def save_settings(vmid: str, settings: dict[str, str]) -> None:
    vm_file(vmid).write_text("".join(f"{k} {v}\n" for k, v in settings.items()))


def die(msg: str, code: int = 2) -> None:
    sys.stderr.write(msg + "\n")
    sys.exit(code)

"""deploy/systemd/: one unit per component, each passing `systemd-analyze verify` (its programs
pointed at this machine's llmgw and etcd, which it checks exist); the agent's unit is what
onboarding renders, and the only copy of it."""
from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from llmgw.onboarding.remote_install import UNIT_NAME, UNITS, Layout, render_unit

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy" / "systemd"
COMPONENTS = ["etcd.service", "llmgw-agent.service", "llmgw-controller-manager.service",
              "llmgw-gateway.service", "llmgw-server.service"]


def test_one_unit_per_component_and_onboarding_ships_them():
    assert sorted(p.name for p in DEPLOY.glob("*.service")) == COMPONENTS
    assert UNITS.resolve() == DEPLOY.resolve()     # the package's units are deploy/systemd/, not a copy
    assert render_unit(Layout("/")).decode().endswith((DEPLOY / UNIT_NAME).read_text())


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze is not installed")
@pytest.mark.parametrize("name", COMPONENTS)
def test_unit_passes_systemd_analyze_verify(name, tmp_path):
    programs = {"/usr/local/bin/llmgw": str(Path(sys.executable).parent / "llmgw"),
                "/usr/local/bin/etcd": shutil.which("etcd") or "/usr/local/bin/etcd"}
    text = (DEPLOY / name).read_text()
    for installed, here in programs.items():
        text = text.replace(installed, here)
    unit = tmp_path / name
    unit.write_text(text)
    done = subprocess.run(["systemd-analyze", "verify", str(unit)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert str(unit) not in done.stderr and name not in done.stderr, done.stderr   # no warning about it


def test_the_gateway_unit_enforces_api_keys_unless_told_otherwise():
    """--watch-api-keys by default; LLMGW_GATEWAY_KEYS= in gateway.env (which overrides the unit's
    Environment=) removes it: `$VAR` unbraced is split on whitespace, so empty is no argument."""
    text = (DEPLOY / "llmgw-gateway.service").read_text()
    assert "\nEnvironment=LLMGW_GATEWAY_KEYS=--watch-api-keys\n" in text
    exec_start = text.split("\nExecStart=", 1)[1].split("\nKillSignal=", 1)[0]
    assert exec_start.split()[-1] == "$LLMGW_GATEWAY_KEYS"

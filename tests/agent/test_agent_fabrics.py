"""Fabric assignment from --fabric specs and a fake sysfs tree; every configuration error
refuses the agent's start with a message naming what is wrong."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from llmgw.agent.discovery.infiniband import discover_ports
from llmgw.agent.fabrics import FabricError, FabricSpec, assign_fabrics

REPO = Path(__file__).resolve().parents[2]
LLMGW = Path(sys.executable).parent / "llmgw"     # the installed console script
sys.path.insert(0, str(REPO / "hack" / "fakes"))
from make_sysfs import FakePort, make_sysfs  # noqa: E402


@pytest.fixture
def ib(tmp_path):
    """Four ACTIVE InfiniBand HCAs, one DOWN, one RoCE."""
    root = tmp_path / "infiniband"
    make_sysfs(root, [FakePort(f"mlx5_{i}") for i in range(4)]
               + [FakePort("mlx5_4", state="DOWN"), FakePort("mlx5_5", link_layer="Ethernet")])
    return str(root)


def assign(ib, *texts):
    return assign_fabrics([FabricSpec.parse(t) for t in texts], discover_ports(ib), ib)


def names(assignment, fabric):
    return [a for a, _ in assignment.adapters(fabric)]


def test_no_fabric_is_an_island(ib):
    assert assign(ib).fabrics == []


def test_a_bare_fabric_claims_the_first_two_active_infiniband_ports(ib):
    a = assign(ib, "ib-a")
    assert names(a, "ib-a") == ["mlx5_0", "mlx5_1"]
    assert a.fabrics[0].adapters[0].state == "ACTIVE"


def test_named_adapters_are_skipped_by_automatic_claims_in_any_order(ib):
    a = assign(ib, "ib-a", "ib-b:mlx5_0,mlx5_2")
    assert names(a, "ib-b") == ["mlx5_0", "mlx5_2"]
    assert names(a, "ib-a") == ["mlx5_1", "mlx5_3"]
    assert [f.name for f in a.fabrics] == ["ib-a", "ib-b"]


def test_a_named_roce_port_with_a_port_number(ib):
    a = assign(ib, "roce:mlx5_5:1")
    assert a.adapters("roce") == [("mlx5_5", 1)]
    assert a.fabrics[0].adapters[0].linkLayer == "Ethernet"


def test_a_named_down_adapter_is_accepted_with_a_warning(ib):
    a = assign(ib, "ib-b:mlx5_4")
    assert names(a, "ib-b") == ["mlx5_4"]
    assert a.warnings == ["fabric ib-b: mlx5_4 port 1 (DOWN, InfiniBand) is not ACTIVE"]


def test_adapter_under_two_fabrics_is_refused(ib):
    with pytest.raises(FabricError, match="adapter mlx5_2 port 1 appears under two fabrics: ib-a and ib-b"):
        assign(ib, "ib-a:mlx5_2,mlx5_3", "ib-b:mlx5_1,mlx5_2")


def test_adapter_twice_in_one_fabric_is_refused(ib):
    with pytest.raises(FabricError, match="adapter mlx5_1 port 1 appears twice under fabric ib-a"):
        assign(ib, "ib-a:mlx5_1,mlx5_1")


def test_missing_named_adapter_is_refused_naming_the_root(ib):
    with pytest.raises(FabricError) as err:
        assign(ib, "ib-b:mlx5_2,mlx5_9")
    assert str(err.value) == (f"fabric ib-b: adapter mlx5_9 not found under {ib} "
                              "(adapters there: mlx5_0, mlx5_1, mlx5_2, mlx5_3, mlx5_4, mlx5_5)")


def test_missing_port_of_a_named_adapter_is_refused(ib):
    with pytest.raises(FabricError, match=r"adapter mlx5_0 has no port '2' under .*/mlx5_0/ports \(ports: 1\)"):
        assign(ib, "ib-b:mlx5_0:2")


def test_fabric_that_cannot_get_its_adapters_is_refused_and_says_why(ib):
    with pytest.raises(FabricError) as err:
        assign(ib, "ib-a", "ib-b", "ib-c")
    msg = str(err.value)
    assert msg.startswith(f"fabric ib-c needs 2 ACTIVE InfiniBand ports that no other fabric names, but {ib} has 0")
    assert "mlx5_0 port 1 (fabric ib-a)" in msg and "mlx5_3 port 1 (fabric ib-b)" in msg
    assert "mlx5_4 port 1 (DOWN, InfiniBand)" in msg and "mlx5_5 port 1 (ACTIVE, Ethernet)" in msg


def test_fabric_on_a_node_without_adapters_is_refused(tmp_path):
    root = str(tmp_path / "none")
    with pytest.raises(FabricError, match="no adapters there; is this the right --ib-root"):
        assign_fabrics([FabricSpec.parse("ib-a")], discover_ports(root), root)


def test_fabric_given_twice_is_refused(ib):
    with pytest.raises(FabricError, match="fabric ib-a is given twice"):
        assign(ib, "ib-a", "ib-a:mlx5_3")


@pytest.mark.parametrize("text, message", [
    ("IB_A", "fabric name 'IB_A' is not a DNS-1123 label"),
    ("ib-a:", "no adapters after ':'"),
])
def test_malformed_fabric_flags(text, message):
    with pytest.raises(FabricError, match=message):
        FabricSpec.parse(text)


def run_agent(*args):
    return subprocess.run([str(LLMGW), "agent", "--node", "n1", *args],
                          capture_output=True, text=True, cwd=REPO)


def test_the_agent_refuses_to_start_on_a_fabric_error(ib, tmp_path):
    done = run_agent("--ib-root", ib, "--nvidia-smi", str(tmp_path / "no-smi"),
                     "--fabric", "ib-a:mlx5_0", "--fabric", "ib-b:mlx5_0", "--server", "https://127.0.0.1:1")
    assert done.returncode == 1
    assert "adapter mlx5_0 port 1 appears under two fabrics: ib-a and ib-b" in done.stderr


def test_the_agent_reports_its_fabrics_when_discovering(ib, tmp_path):
    done = run_agent("--ib-root", ib, "--nvidia-smi", str(tmp_path / "no-smi"),
                     "--fabric", "ib-b:mlx5_2,mlx5_3", "--fabric", "ib-a", "--discover")
    assert done.returncode == 0, done.stderr
    assert "name: ib-b" in done.stdout and "name: mlx5_3" in done.stdout
    assert f"nvidia-smi not found: {tmp_path / 'no-smi'}" in done.stdout

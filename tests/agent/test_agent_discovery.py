"""GPU discovery against the fake nvidia-smi (hack/fakes/nvidia-smi), run as a real program,
and InfiniBand discovery against fake sysfs trees (hack/fakes/make_sysfs.py)."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

from llmgw.agent.discovery.gpu import discover_gpus
from llmgw.agent.discovery.infiniband import discover_ports
from llmgw.agent.process import is_alive
from tests.fixtures.poll import until_sync

REPO = Path(__file__).resolve().parents[2]
FAKE_SMI = REPO / "hack" / "fakes" / "nvidia-smi"
sys.path.insert(0, str(REPO / "hack" / "fakes"))
from make_sysfs import FakePort, make_sysfs  # noqa: E402


def fake_smi(tmp_path: Path, mode: str = "normal", gpus: int = 2, pidfile: Path | None = None) -> str:
    """A wrapper executable that fixes the fake's behaviour, as a test would install it."""
    script = tmp_path / f"nvidia-smi-{mode}"
    record = f'echo $$ > "{pidfile}"\n' if pidfile else ""
    script.write_text(f'#!/bin/sh\n{record}exec "{FAKE_SMI}" --fake-mode={mode} --fake-gpus={gpus} "$@"\n')
    script.chmod(0o755)
    return str(script)


def test_normal_driver_reports_every_gpu(tmp_path):
    report = discover_gpus(fake_smi(tmp_path, gpus=3))
    assert report.ok, report.error
    assert [g.index for g in report.gpus] == [0, 1, 2]
    gpu = report.gpus[1]
    assert gpu.uuid == "GPU-fa4e0000-0000-4000-8000-000000000001"
    assert gpu.name == "NVIDIA H100 80GB HBM3"
    assert gpu.memoryMiB == 81559
    assert gpu.memoryFreeMiB == 81556     # the fake's 3 MiB in use
    assert gpu.computeCap == "9.0"
    assert gpu.pciBusId == "00000000:19:00.0"
    assert report.driver_version == "570.86.15"


def test_the_memory_a_smaller_gpu_reports(tmp_path):
    script = tmp_path / "nvidia-smi-small"
    script.write_text(f'#!/bin/sh\nexec "{FAKE_SMI}" --fake-gpus=1 --fake-memory=24576 "$@"\n')
    script.chmod(0o755)
    (gpu,) = discover_gpus(str(script)).gpus
    assert (gpu.memoryMiB, gpu.memoryFreeMiB) == (24576, 24573)


def test_old_driver_is_asked_again_without_compute_cap(tmp_path):
    report = discover_gpus(fake_smi(tmp_path, "old-driver", gpus=2))
    assert report.ok, report.error
    assert len(report.gpus) == 2
    assert all(g.computeCap is None for g in report.gpus)
    assert report.gpus[0].memoryMiB == 81559
    assert report.driver_version == "470.256.02"


def test_na_and_not_supported_fields_become_unknown_not_errors(tmp_path):
    report = discover_gpus(fake_smi(tmp_path, "na", gpus=2))
    assert report.ok, report.error
    assert [g.index for g in report.gpus] == [0, 1]
    assert report.gpus[0].memoryMiB is None and report.gpus[0].memoryFreeMiB is None
    assert report.gpus[0].computeCap is None
    assert report.gpus[0].name == "NVIDIA H100 80GB HBM3"


def test_no_driver_is_an_error_naming_the_path_and_the_exit_code(tmp_path):
    path = fake_smi(tmp_path, "no-driver")
    report = discover_gpus(path)
    assert not report.ok
    assert report.gpus == []
    assert path in report.error
    assert "exited with code 9" in report.error
    assert "couldn't communicate with the NVIDIA driver" in report.error


def test_missing_binary_is_an_error_naming_the_path(tmp_path):
    path = str(tmp_path / "bin" / "nvidia-smi")
    report = discover_gpus(path)
    assert not report.ok
    assert report.error == f"nvidia-smi not found: {path}"


def test_not_executable_is_an_error_naming_the_path(tmp_path):
    path = tmp_path / "nvidia-smi"
    path.write_text("#!/bin/sh\necho hi\n")
    report = discover_gpus(str(path))
    assert not report.ok
    assert report.error == f"{path} is not executable"


def test_a_hang_is_killed_and_reported(tmp_path):
    pidfile = tmp_path / "pid"
    path = fake_smi(tmp_path, "hang", pidfile=pidfile)
    report = discover_gpus(path, timeout=0.5)
    assert not report.ok
    assert report.error == f"{path} did not answer within 0.5 s (killed)"
    pid = int(pidfile.read_text())
    assert not is_alive(pid), "the hung nvidia-smi was left running"


def test_zero_gpus_is_never_silent(tmp_path):
    report = discover_gpus(fake_smi(tmp_path, gpus=0))
    assert not report.ok
    assert "listed no GPUs" in report.error


def test_unreadable_output_names_the_line(tmp_path):
    path = tmp_path / "nvidia-smi"
    path.write_text("#!/bin/sh\necho 'garbage without commas'\n")
    path.chmod(0o755)
    report = discover_gpus(str(path))
    assert not report.ok
    assert "line 1" in report.error and "garbage without commas" in report.error


def test_the_fake_is_usable_from_the_shell_with_environment_variables():
    env = {**os.environ, "FAKE_NVIDIA_SMI_MODE": "no-driver"}
    done = subprocess.run([str(FAKE_SMI)], env=env, capture_output=True, text=True)
    assert done.returncode == 9
    env = {**os.environ, "FAKE_NVIDIA_SMI_GPUS": "4"}
    done = subprocess.run([str(FAKE_SMI), "--query-gpu=index,uuid", "--format=csv,noheader,nounits"],
                          env=env, capture_output=True, text=True)
    assert done.returncode == 0
    assert len(done.stdout.splitlines()) == 4


# ------------------------------------------------------------------ InfiniBand

def test_two_hcas(tmp_path):
    make_sysfs(tmp_path, [FakePort("mlx5_1", rate_gbps=200), FakePort("mlx5_0")])
    ports = discover_ports(str(tmp_path))
    assert [(p.adapter, p.port) for p in ports] == [("mlx5_0", 1), ("mlx5_1", 1)]
    assert ports[0].state == "ACTIVE"
    assert ports[0].link_layer == "InfiniBand"
    assert ports[0].rate == "400 Gb/sec (4X NDR)"
    assert ports[1].rate == "200 Gb/sec (4X HDR)"
    assert all(p.usable for p in ports)


def test_a_roce_port_is_seen_but_is_not_infiniband(tmp_path):
    make_sysfs(tmp_path, [FakePort("mlx5_0"), FakePort("mlx5_1", link_layer="Ethernet", rate_gbps=100)])
    roce = discover_ports(str(tmp_path))[1]
    assert (roce.adapter, roce.state, roce.link_layer) == ("mlx5_1", "ACTIVE", "Ethernet")
    assert not roce.usable


def test_a_down_port(tmp_path):
    make_sysfs(tmp_path, [FakePort("mlx5_0", state="DOWN")])
    (port,) = discover_ports(str(tmp_path))
    assert port.state == "DOWN"
    assert not port.usable
    assert port.to_api().model_dump() == {"name": "mlx5_0", "port": 1, "state": "DOWN",
                                          "linkLayer": "InfiniBand", "rate": "400 Gb/sec (4X NDR)"}


def test_several_ports_of_one_adapter_in_number_order(tmp_path):
    make_sysfs(tmp_path, [FakePort("mlx5_0", port=2), FakePort("mlx5_0", port=1, state="INIT")])
    assert [(p.port, p.state) for p in discover_ports(str(tmp_path))] == [(1, "INIT"), (2, "ACTIVE")]


def test_bytes_that_are_not_utf8_in_sysfs_are_not_fatal(tmp_path):
    make_sysfs(tmp_path, [FakePort("mlx5_0")])
    (tmp_path / "mlx5_0" / "ports" / "1" / "rate").write_bytes(b"400 Gb/sec (4X \xff\xfe)\n")
    (tmp_path / "mlx5_0" / "ports" / "\u00b2").mkdir()  # a digit to str.isdigit, not to int()
    (port,) = discover_ports(str(tmp_path))
    assert (port.state, port.rate) == ("ACTIVE", "400 Gb/sec (4X \ufffd\ufffd)")


def test_no_sysfs_root_means_no_adapters(tmp_path):
    assert discover_ports(str(tmp_path / "absent")) == []


def test_make_sysfs_command_line(tmp_path):
    done = subprocess.run([sys.executable, str(REPO / "hack" / "fakes" / "make_sysfs.py"), str(tmp_path),
                           "mlx5_0", "mlx5_1/2:DOWN", "mlx5_2:ACTIVE:Ethernet:100"],
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    ports = discover_ports(str(tmp_path))
    assert [(p.adapter, p.port, p.state, p.link_layer) for p in ports] == [
        ("mlx5_0", 1, "ACTIVE", "InfiniBand"), ("mlx5_1", 2, "DOWN", "InfiniBand"),
        ("mlx5_2", 1, "ACTIVE", "Ethernet")]


# ------------------------------------------------------------------ hostile nvidia-smi

def _script(tmp_path: Path, name: str, body: str) -> str:
    path = tmp_path / name
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(0o755)
    return str(path)




def test_output_that_is_not_utf8_still_lists_the_gpus(tmp_path):
    # a GPU name in Latin-1 (0xe9); the agent used to die at startup on UnicodeDecodeError
    line = "0, GPU-1, Caf\\351 GPU, 81559, 3, 0, 34, 570.86.15, 00000000:19:00.0, 9.0"
    report = discover_gpus(_script(tmp_path, "smi", f"printf '{line}\\n'\n"))
    assert report.ok, report.error
    assert report.gpus[0].name == "Caf\ufffd GPU" and report.gpus[0].memoryMiB == 81559


def test_a_child_holding_the_pipe_does_not_hold_discovery(tmp_path):
    # nvidia-smi answers and exits, leaving a child with its stdout: reading to the pipe's
    # end would wait for the child (for ever here) and then report a timeout
    pidfile = tmp_path / "child"
    path = fake_smi(tmp_path, gpus=2)
    wrapper = _script(tmp_path, "smi-with-child", f'sleep 3600 & echo $! > "{pidfile}"\nexec "{path}" "$@"\n')
    report = discover_gpus(wrapper, timeout=60)
    assert report.ok, report.error
    assert len(report.gpus) == 2
    child = int(pidfile.read_text())   # SIGKILL is delivered asynchronously
    until_sync(lambda: not is_alive(child), "the child left behind to be killed", timeout=10)


def test_the_timeout_holds_when_a_child_escapes_the_kill(tmp_path):
    # a child in its own session keeps the pipe open and survives killing nvidia-smi's
    # group (as a process stuck in the kernel survives SIGKILL): discovery must still end
    pidfile = tmp_path / "escaped"
    path = _script(tmp_path, "smi-escaping", f'setsid sh -c \'echo $$ > "{pidfile}"; exec sleep 3600\' &\n'
                                               "exec sleep 3600\n")
    result: list = []
    worker = threading.Thread(target=lambda: result.append(discover_gpus(path, timeout=0.5)), daemon=True)
    worker.start()
    worker.join(60)  # a bound on a hang, not a speed check: the old code waited for the pipe's end
    try:
        assert not worker.is_alive(), "discovery waited for the escaped child's pipe"
        assert result[0].error == f"{path} did not answer within 0.5 s (killed)"
    finally:
        for _ in range(100):
            if pidfile.exists() and pidfile.read_text().strip():
                os.kill(int(pidfile.read_text()), signal.SIGKILL)
                break
            worker.join(0.05)

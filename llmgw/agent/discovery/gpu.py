"""GPU discovery through nvidia-smi's CSV query.

Never reports a silent "0 GPUs": when nvidia-smi is missing, fails, hangs or
prints something unreadable, the result carries an error naming the path
tried and what went wrong, and the Node's GPUDiscovery condition says so.
"""
from __future__ import annotations

import csv
import os
import shutil
import signal
import subprocess
from dataclasses import dataclass, field

from llmgw.api import GPU

DEFAULT_NVIDIA_SMI = "/usr/bin/nvidia-smi"
FIELDS = ["index", "uuid", "name", "memory.total", "memory.used", "utilization.gpu",
          "temperature.gpu", "driver_version", "pci.bus_id", "compute_cap"]
# Drivers older than about 510 reject this field (exit 2); the query is retried without it.
OPTIONAL_FIELD = "compute_cap"
MISSING_VALUES = {"[N/A]", "[Not Supported]", "N/A", "[Unknown Error]", "[Insufficient Permissions]", ""}


@dataclass
class GPUReport:
    """What discovery found. `error` set means discovery failed; gpus is then meaningless."""

    path: str
    gpus: list[GPU] = field(default_factory=list)
    driver_version: str | None = None
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None


class _Failed(Exception):
    pass


def resolve_nvidia_smi(configured: str | None) -> tuple[str | None, str]:
    """(path to run or None, what was tried). Default: /usr/bin/nvidia-smi, then PATH."""
    if configured:
        configured = os.path.abspath(configured)
        return (configured if os.path.exists(configured) else None), configured
    if os.path.exists(DEFAULT_NVIDIA_SMI):
        return DEFAULT_NVIDIA_SMI, DEFAULT_NVIDIA_SMI
    found = shutil.which("nvidia-smi")
    return found, f"{DEFAULT_NVIDIA_SMI} and nvidia-smi on PATH"


def discover_gpus(nvidia_smi: str | None = None, timeout: float = 10.0) -> GPUReport:
    path, tried = resolve_nvidia_smi(nvidia_smi)
    if path is None:
        return GPUReport(path=tried, error=f"nvidia-smi not found: {tried}")
    report = GPUReport(path=path)
    try:
        fields = list(FIELDS)
        code, out = _run(path, fields, timeout)
        if code == 2 and f'"{OPTIONAL_FIELD}"' in out:
            fields.remove(OPTIONAL_FIELD)
            code, out = _run(path, fields, timeout)
        if code != 0:
            raise _Failed(f"{path} exited with code {code}: {_first_line(out)}")
        report.gpus, report.driver_version = _parse(path, fields, out)
        if not report.gpus:
            raise _Failed(f"{path} ran but listed no GPUs")
    except _Failed as err:
        report.error = str(err)
        report.gpus = []
    return report


def _run(path: str, fields: list[str], timeout: float) -> tuple[int, str]:
    argv = [path, f"--query-gpu={','.join(fields)}", "--format=csv,noheader,nounits"]
    try:
        # Own session, so a hung nvidia-smi and anything it started can be killed together.
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True, text=True)
    except PermissionError:
        raise _Failed(f"{path} is not executable") from None
    except OSError as err:
        raise _Failed(f"{path} could not be run: {err.strerror or err}") from None
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        _kill_group(proc.pid)
        proc.communicate()
        raise _Failed(f"{path} did not answer within {timeout:g} s (killed)") from None
    return proc.returncode, out


def _kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def _first_line(out: str) -> str:
    lines = [ln.strip() for ln in out.splitlines() if ln.strip()]
    return lines[0] if lines else "(no output)"


def _value(raw: str) -> str | None:
    raw = raw.strip()
    return None if raw in MISSING_VALUES else raw


def _int(raw: str | None) -> int | None:
    if raw is None:
        return None
    try:
        return int(float(raw))
    except ValueError:
        return None


def _parse(path: str, fields: list[str], out: str) -> tuple[list[GPU], str | None]:
    gpus: list[GPU] = []
    drivers: set[str] = set()
    for lineno, row in enumerate(csv.reader(out.splitlines(), skipinitialspace=True), 1):
        if not row or not any(c.strip() for c in row):
            continue
        if len(row) != len(fields):
            raise _Failed(f"{path} printed line {lineno} with {len(row)} fields, expected "
                          f"{len(fields)} ({','.join(fields)}): {','.join(row)[:200]!r}")
        values = dict(zip(fields, (_value(c) for c in row)))
        index = _int(values["index"])
        if index is None:
            raise _Failed(f"{path} printed line {lineno} without a GPU index: {','.join(row)[:200]!r}")
        if values.get("driver_version"):
            drivers.add(values["driver_version"])
        gpus.append(GPU(
            index=index, uuid=values["uuid"], name=values["name"],
            memoryMiB=_int(values["memory.total"]), computeCap=values.get("compute_cap"),
            pciBusId=values["pci.bus_id"],
        ))
    return sorted(gpus, key=lambda g: g.index), (sorted(drivers)[0] if drivers else None)

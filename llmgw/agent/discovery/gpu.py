"""GPU discovery through nvidia-smi's CSV query.

Never reports a silent "0 GPUs": when nvidia-smi is missing, fails, hangs or
prints something unreadable, the result carries an error naming the path
tried and what went wrong, and the Node's GPUDiscovery condition says so.
"""
from __future__ import annotations

import csv
import os
import selectors
import shutil
import signal
import subprocess
import threading
import time
from dataclasses import dataclass, field

from llmgw.api import GPU

DEFAULT_NVIDIA_SMI = "/usr/bin/nvidia-smi"
FIELDS = ["index", "uuid", "name", "memory.total", "memory.free", "utilization.gpu",
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
    """nvidia-smi's exit code and output, within `timeout` seconds whatever it and its children do.

    The output is read until nvidia-smi exits, not until the pipe's end: a child it left
    behind may hold the pipe open for ever. Then its whole session is killed, and it is
    reaped only if it goes at once: a process stuck in the kernel does not die on SIGKILL.
    """
    argv = [path, f"--query-gpu={','.join(fields)}", "--format=csv,noheader,nounits"]
    try:
        # Own session, so a hung nvidia-smi and anything it started can be killed together.
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True)
    except PermissionError:
        raise _Failed(f"{path} is not executable") from None
    except OSError as err:
        raise _Failed(f"{path} could not be run: {err.strerror or err}") from None
    assert proc.stdout is not None  # stdout=PIPE
    try:
        out, answered = _read_until_exit(proc, time.monotonic() + timeout)
    finally:
        _kill_group(proc.pid)
        proc.stdout.close()
        _reap(proc)
    if not answered:
        raise _Failed(f"{path} did not answer within {timeout:g} s (killed)")
    # Not UTF-8 (a GPU name in another encoding, a garbled line) is replaced, not fatal.
    return proc.returncode, out.decode("utf-8", errors="replace")


def _read_until_exit(proc: subprocess.Popen[bytes], deadline: float) -> tuple[bytes, bool]:
    """(output, whether the process exited before the deadline)."""
    chunks: list[bytes] = []
    assert proc.stdout is not None  # stdout=PIPE
    fd = proc.stdout.fileno()
    with selectors.DefaultSelector() as sel:
        sel.register(fd, selectors.EVENT_READ)
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                return b"".join(chunks), proc.poll() is not None
            # A short wait while nvidia-smi runs, so its exit is seen though a child holds the pipe.
            if sel.select(min(left, 0.05)):
                data = os.read(fd, 65536)
                if not data:  # end of the pipe, but nvidia-smi may have closed it and still run
                    try:
                        proc.wait(left)
                    except subprocess.TimeoutExpired:
                        return b"".join(chunks), False
                    return b"".join(chunks), True
                chunks.append(data)
            elif proc.poll() is not None:
                return b"".join(chunks), True  # exited and nothing more to read


def _reap(proc: subprocess.Popen[bytes]) -> None:
    try:
        proc.wait(timeout=1)
    except subprocess.TimeoutExpired:  # stuck in the kernel: reap it whenever it goes
        threading.Thread(target=proc.wait, name="reap-nvidia-smi", daemon=True).start()


def _kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
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
        values = dict(zip(fields, (_value(c) for c in row), strict=False))
        index = _int(values["index"])
        if index is None:
            raise _Failed(f"{path} printed line {lineno} without a GPU index: {','.join(row)[:200]!r}")
        driver = values.get("driver_version")
        if driver:
            drivers.add(driver)
        gpus.append(GPU(
            index=index, uuid=values["uuid"], name=values["name"],
            memoryMiB=_int(values["memory.total"]), memoryFreeMiB=_int(values["memory.free"]),
            computeCap=values.get("compute_cap"),
            pciBusId=values["pci.bus_id"],
        ))
    return sorted(gpus, key=lambda g: g.index), (sorted(drivers)[0] if drivers else None)

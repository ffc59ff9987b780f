"""Stopping the processes a local cluster or a test started."""
from __future__ import annotations

import subprocess


def terminate(proc: subprocess.Popen, timeout: float = 10.0) -> None:
    """SIGTERM, wait up to `timeout`, then SIGKILL; returns once the process is gone."""
    if proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()

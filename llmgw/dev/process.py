"""Ports, readiness and stopping for the processes a local cluster, a benchmark or a test starts."""
from __future__ import annotations

import os
import socket
import ssl
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any, Callable

LLMGW = [sys.executable, "-m", "llmgw.cli.main"]   # the `llmgw` command, in this interpreter


def free_port(host: str = "127.0.0.1") -> int:
    """A port of `host` (loopback) nobody listens on right now."""
    with socket.socket() as s:
        s.bind((host, 0))
        port: int = s.getsockname()[1]
        return port


def wait_http(url: str, alive: Callable[[], None], what: str, timeout: float = 60.0,
              ready: Callable[[bytes], bool] = lambda body: True, context: ssl.SSLContext | None = None) -> None:
    """Poll `url` until it answers 2xx with a body `ready` accepts.

    `alive()` raises when the process behind the URL died (so a crash is reported
    at once, not as a timeout); TimeoutError names `what` otherwise. `context`: TLS for an
    https URL (a client certificate, where the server asks for one).
    """
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        alive()
        try:
            with urllib.request.urlopen(url, timeout=2, context=context) as r:
                if ready(r.read()):
                    return
        except OSError:
            pass
        time.sleep(0.05)
    raise TimeoutError(f"{what} did not answer at {url} within {timeout:.0f}s")


def spawn(argv: list[str], log_path: Path, env: dict[str, str] | None = None,
          cwd: Path | None = None) -> subprocess.Popen[bytes]:
    """`argv` in a session of its own (a group to signal), its output appended to `log_path`
    (`env`: the whole environment; by default this one, unbuffered)."""
    with open(log_path, "ab") as log:
        return subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True, cwd=cwd,
                                env=env if env is not None else {**os.environ, "PYTHONUNBUFFERED": "1"})


def terminate(proc: subprocess.Popen[Any], timeout: float = 10.0) -> None:
    """SIGTERM, wait up to `timeout`, then SIGKILL; returns once the process is gone."""
    if proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()

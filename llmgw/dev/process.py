"""Ports, readiness and stopping for the processes a local cluster, a benchmark or a test starts."""
from __future__ import annotations

import fcntl
import functools
import os
import signal
import socket
import ssl
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any, Callable

from llmgw.dev import slots

LLMGW = [sys.executable, "-m", "llmgw.cli.main"]   # the `llmgw` command, in this interpreter


def free_port(host: str = "127.0.0.1") -> int:
    """A port of `host` (loopback) nobody listens on now, reserved to this process until it exits.

    The component given it binds it later, so the port must stay free until then. It lies outside
    the kernel's ephemeral range (ip_local_port_range), where no outgoing connection's local port
    and no bind to port 0 can land, and outside the local clusters' engine ports (llmgw.dev.slots);
    and a lock on its byte of <tmp>/llmgw-dev-slots/ports.lock, held as long as this process lives
    (however it exits), keeps every other process's free_port off it: the tests' workers, `llmgw dev
    up`, the benchmarks. This process never hands it out again either, so a component may stop and
    start again on its port.
    """
    with _RESERVED.lock:
        if _RESERVED.fd < 0:
            directory = slots.slot_dir()
            directory.mkdir(mode=0o1777, exist_ok=True)
            _RESERVED.fd = os.open(directory / "ports.lock", os.O_RDWR | os.O_CREAT, 0o666)
        candidates, start = _outside_ephemeral(), _RESERVED.next
        for i in range(len(candidates)):   # once round, from where the last search ended
            port = candidates[(start + i) % len(candidates)]
            if port in _RESERVED.ports:
                continue
            try:   # a POSIX record lock: per process, gone when it exits
                fcntl.lockf(_RESERVED.fd, fcntl.LOCK_EX | fcntl.LOCK_NB, 1, port)
            except (BlockingIOError, PermissionError):
                continue   # another process's
            _RESERVED.ports.add(port)   # ours from here on, free or not
            with socket.socket() as s:
                try:
                    s.bind((host, port))
                except OSError:
                    continue   # bound by something that does not reserve (a stray process)
            _RESERVED.next = start + i + 1
            return port
    raise RuntimeError("no free port outside the kernel's ephemeral range "
                       "(/proc/sys/net/ipv4/ip_local_port_range) and the local clusters' engine ports")


class _Reserved:
    """This process's ports (its locks on ports.lock)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.fd = -1
        self.ports: set[int] = set()
        self.next = 0   # where in _outside_ephemeral() the next search starts


_RESERVED = _Reserved()


@functools.lru_cache(maxsize=1)
def _outside_ephemeral() -> tuple[int, ...]:
    """The unprivileged ports neither in the kernel's ephemeral range nor the slots' engine ports, highest first."""
    try:
        low, high = map(int, Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
    except (OSError, ValueError):
        low, high = 32768, 60999   # Linux's default
    engines = range(slots.FIRST_PORT, slots.FIRST_PORT + slots.SLOTS * slots.PORTS_PER_SLOT)
    return tuple(p for p in range(65535, 1023, -1) if not low <= p <= high and p not in engines)


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


def freeze(proc: subprocess.Popen[Any]) -> None:
    """SIGSTOP a child, returning once it has stopped: silent from then on, until SIGCONT.

    kill() only queues the signal: each of the process's threads stops when it next runs, and
    until the last one has, the others go on (on a loaded machine, for as long as the scheduler
    takes to run them): an etcd answered reads sent after kill() had returned. Its parent's
    waitpid(WUNTRACED) reports the stop once every thread has stopped."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGSTOP)
        _, status = os.waitpid(proc.pid, os.WUNTRACED)
        if os.WIFSTOPPED(status):
            return
        proc.returncode = os.waitstatus_to_exitcode(status)   # reaped here: poll() and wait() say it
    raise RuntimeError(f"{proc.args!r} exited with {proc.returncode} instead of stopping")


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

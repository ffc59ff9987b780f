"""freeze: a child SIGSTOPped and stopped, every thread of it, by the time it returns.

kill() returns once the signal is queued; the process's threads stop as each next runs, so a
test that signalled etcd and then asked the API server a question could have it answered by etcd
(tests/server/test_server_weights_index.py failed so in a full run).
"""
from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import pytest

from llmgw.dev.process import freeze, terminate

# threads that wake every millisecond: each is running or about to, whenever the signal comes
BUSY = """
import threading, time
def tick():
    while True:
        time.sleep(0.001)
for _ in range(6):
    threading.Thread(target=tick, daemon=True).start()
print("ready", flush=True)
tick()
"""


def thread_states(pid: int) -> list[str]:
    return [(task / "stat").read_text().rsplit(")", 1)[1].split()[0]
            for task in Path(f"/proc/{pid}/task").iterdir()]


def test_a_frozen_child_has_stopped_every_thread_and_goes_on_once_continued() -> None:
    proc = subprocess.Popen([sys.executable, "-c", BUSY], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline() == "ready\n"
        for _ in range(20):
            freeze(proc)
            assert thread_states(proc.pid) == ["T"] * 7      # stopped, not only signalled
            proc.send_signal(signal.SIGCONT)
        assert proc.poll() is None
    finally:
        terminate(proc)
    assert proc.returncode == -signal.SIGTERM   # the stops reported to freeze left its exit to wait()


def test_freezing_a_child_that_exited_says_so_and_keeps_its_code() -> None:
    proc = subprocess.Popen([sys.executable, "-c", "raise SystemExit(3)"])
    proc.wait()
    with pytest.raises(RuntimeError, match="exited with 3 instead of stopping"):
        freeze(proc)

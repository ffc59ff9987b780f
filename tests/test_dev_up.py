"""`llmgw dev up`, the README's first command, as a user runs it: twice on the same directory.

The second run starts on state the first one left: replicas whose status still
says Ready, engines that are gone. Its "Ready" must still mean that a request
through the gateway is answered.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
import time
import urllib.error
import urllib.request

import pytest

from llmgw.dev.cluster import LocalCluster
from llmgw.dev.process import free_port

pytestmark = pytest.mark.timeout(400)


class DevUp:
    def __init__(self, directory, port: int):
        self.lines: list[str] = []
        self.port = port
        self.proc = subprocess.Popen(
            [*LocalCluster.llmgw, "dev", "up", "--dir", str(directory),
             "--gateway-port", str(port), "--timeout", "150"],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env={**os.environ, "COLUMNS": "200"})
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self):
        for line in self.proc.stdout:
            self.lines.append(line.rstrip("\n"))

    def wait_for(self, text: str, timeout: float = 200.0) -> None:
        deadline = time.monotonic() + timeout
        while not any(text in line for line in self.lines):
            assert self.proc.poll() is None, "dev up exited:\n" + "\n".join(self.lines[-30:])
            assert time.monotonic() < deadline, f"no {text!r} within {timeout:.0f}s:\n" + "\n".join(self.lines[-30:])
            time.sleep(0.2)

    def complete(self, model: str) -> tuple[int, str]:
        body = json.dumps({"model": model, "messages": [{"role": "user", "content": "hi"}]}).encode()
        req = urllib.request.Request(f"http://127.0.0.1:{self.port}/v1/chat/completions", body,
                                     {"content-type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=30) as resp:
                return resp.status, resp.read().decode()
        except urllib.error.HTTPError as err:
            return err.code, err.read().decode()

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
        code = self.proc.wait(60)
        self._reader.join(10)       # the last lines
        return code


def dev_down(directory) -> str:
    out = subprocess.run([*LocalCluster.llmgw, "dev", "down", "--dir", str(directory)],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return out.stdout


def test_dev_up_twice_on_the_same_directory_serves_once_it_says_ready(tmp_path):
    # the first run is stopped with Ctrl-C, the second from elsewhere with `llmgw dev down`
    for run in ("first", "second"):
        up = DevUp(tmp_path / "dev", free_port())
        try:
            up.wait_for("Ctrl-C here")
            assert any("answering through the gateway" in line for line in up.lines), up.lines[-30:]
            assert any("reusing the state" in line for line in up.lines) == (run == "second")
            for model in ("small", "sim-large"):
                status, text = up.complete(model)
                assert status == 200, f"{run} run, {model}: {status} {text}"
                assert json.loads(text)["choices"][0]["message"]["content"]
            if run == "second":
                assert "stopped" in dev_down(tmp_path / "dev")
        finally:
            code = up.stop()
        assert code == 0, "\n".join(up.lines[-30:])
        assert "stopped; nothing left running" in up.lines[-1]
        assert not any("error" in line for line in up.lines), up.lines[-30:]

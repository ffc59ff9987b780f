"""`llmgw dev up`, the README's first command, as a user runs it: twice on the same directory.

The second run starts on state the first one left: replicas whose status still
says Ready, engines that are gone. Its "Ready" must still mean that a request
through the gateway is answered.
"""
from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import threading
import tomllib
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from llmgw.api import Node, parse_object
from llmgw.client import Client, ClientConfig
from llmgw.dev.cluster import LocalCluster, NodePlan
from llmgw.dev.process import LLMGW, free_port
from llmgw.store import Store, StoreUnavailable
from tests.fixtures.poll import until, until_sync

REPO = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.timeout(400)


class DevUp:
    def __init__(self, directory, port: int, *args: str):
        self.lines: list[str] = []
        self.port = port
        self.proc = subprocess.Popen(
            [*LLMGW, "dev", "up", "--dir", str(directory),
             "--gateway-port", str(port), "--timeout", "150", *args],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env={**os.environ, "COLUMNS": "200"})
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self):
        for line in self.proc.stdout:
            self.lines.append(line.rstrip("\n"))

    def wait_for(self, text: str, timeout: float = 200.0) -> None:
        def printed() -> bool:
            exited = self.proc.poll() is not None  # read before the lines: what it printed before exiting counts
            if any(text in line for line in self.lines):
                return True
            assert not exited, "dev up exited:\n" + "\n".join(self.lines[-30:])
            return False
        until_sync(printed, f"{text!r} from dev up", timeout=timeout, interval=0.2,
                   detail=lambda: "\n".join(self.lines[-30:]))

    def complete(self, model: str, key: str | None = None) -> tuple[int, str]:
        body = json.dumps({"model": model, "messages": [{"role": "user", "content": "hi"}]}).encode()
        req = urllib.request.Request(f"http://127.0.0.1:{self.port}/v1/chat/completions", body,
                                     {"content-type": "application/json",
                                      **({"authorization": f"Bearer {key}"} if key else {})})
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


def printed_openai_example(lines: list[str]) -> str:
    """The `python -c 'import openai; ...'` command dev up printed, its continuation lines joined."""
    start = next(i for i, line in enumerate(lines) if "import openai" in line)
    end = next(i for i in range(start, len(lines)) if lines[i].rstrip().endswith(")'"))
    return "\n".join(lines[start:end + 1])


def test_the_first_commands_virtualenv_has_what_dev_ups_examples_need():
    """hack/up.sh makes the virtualenv `dev up` runs in: the extra it installs holds the openai client
    the printed example imports (the test extra's openai does not count: up.sh does not install it)."""
    extra = re.search(r'ensure_venv "\[(\w+)\]"', (REPO / "hack" / "up.sh").read_text()).group(1)
    wanted = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"][extra]
    assert any(req.startswith("openai") for req in wanted), wanted


def dev_down(directory) -> str:
    out = subprocess.run([*LLMGW, "dev", "down", "--dir", str(directory)],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return out.stdout


def test_dev_up_twice_on_the_same_directory_serves_once_it_says_ready(tmp_path):
    """The first run, stopped with Ctrl-C, serves each example model and its printed openai example
    works; the second, on the state the first left and with `--api-keys`, serves once it says ready
    too (with the key it printed), and is stopped from elsewhere with `llmgw dev down`."""
    for run, args in (("first", ()), ("second", ("--api-keys",))):
        up = DevUp(tmp_path / "dev", free_port(), *args)
        try:
            up.wait_for("Ctrl-C here")
            assert any("answering through the gateway" in line for line in up.lines), up.lines[-30:]
            assert any("reusing the state" in line for line in up.lines) == (run == "second")
            key = _keys_work_as_printed(up) if run == "second" else None
            for model in ("small", "sim-large"):
                status, text = up.complete(model, key)
                assert status == 200, f"{run} run, {model}: {status} {text}"
                assert json.loads(text)["choices"][0]["message"]["content"]
            if run == "first":   # the openai example it printed works as printed
                done = subprocess.run(["bash", "-c", printed_openai_example(up.lines)], capture_output=True,
                                      text=True, timeout=60)
                assert done.returncode == 0 and done.stdout.strip(), done.stderr
            if run == "second":
                assert "stopped" in dev_down(tmp_path / "dev")
        finally:
            code = up.stop()
        assert code == 0, "\n".join(up.lines[-30:])
        assert "stopped; nothing left running" in up.lines[-1]
        assert not any("error" in line for line in up.lines), up.lines[-30:]


def _keys_work_as_printed(up: DevUp) -> str:
    """`dev up --api-keys`: what it prints works as printed (the first key's curl and openai examples,
    the `create apikey` of a 3-rpm key, which does not warn: the gateway enforces keys); a request
    without a key is 401, the 3-rpm key of `small` asking for `large` 404, its fourth request in a
    minute 429. Returns the first key's secret (every model, no limits)."""
    first = next(i for i, line in enumerate(up.lines) if line.strip().startswith("curl -s "))
    curl = "\n".join(up.lines[first:first + 2])
    secret = re.search(r"Bearer (llmgw_dev_\S+?)[\"' ]", curl)
    assert secret, curl
    export = next(line for line in up.lines if line.strip().startswith("export LLMGW_CONFIG="))
    create = next(line for line in up.lines if "create apikey team-a" in line)
    answers = []
    for command in (curl, printed_openai_example(up.lines)):
        done = subprocess.run(["bash", "-c", command], capture_output=True, text=True, timeout=60)
        assert done.returncode == 0 and done.stdout.strip(), (command, done.stderr)
        answers.append(done.stdout)
    assert json.loads(answers[0])["choices"][0]["message"]["content"]
    assert up.complete("small")[0] == 401

    made = subprocess.run(["bash", "-c", f"{export}\n{create}"], capture_output=True, text=True, timeout=60)
    assert made.returncode == 0 and "warning" not in made.stderr, made.stderr
    key = made.stdout.strip()
    listed = subprocess.run(["bash", "-c", f"{export}\n{create.split(' create ')[0]} get apikeys"],
                            capture_output=True, text=True, timeout=60)
    assert listed.returncode == 0 and "team-a" in listed.stdout and "warning" not in listed.stderr, listed

    def seen(model):   # the gateway knows the new key once it stops answering 401 for it
        status = up.complete(model, key)[0]
        return status if status != 401 else None
    assert until_sync(lambda: seen("large"), "the gateway to know the key", timeout=30) == 404
    assert [up.complete("small", key)[0] for _ in range(4)] == [200, 200, 200, 429]
    return secret.group(1)


def _netns_of(pid: int) -> str:
    return subprocess.run(["ip", "netns", "identify", str(pid)], capture_output=True, text=True).stdout.strip()


def _namespaces() -> set[str]:
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    return {line.split()[0] for line in listed.splitlines() if line.strip()}


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("ip") is None, reason="network namespaces need root and ip")
def test_dev_up_netns_runs_each_node_in_a_namespace_of_its_own_and_removes_them(tmp_path):
    up = DevUp(tmp_path / "dev", free_port(), "--netns")
    try:
        up.wait_for("Ctrl-C here")
        saved = json.loads((tmp_path / "dev" / "netns.json").read_text())
        assert len(saved["netns"]) == 4 and set(saved["netns"]) <= _namespaces(), saved
        pids = json.loads((tmp_path / "dev" / "cluster.json").read_text())["pids"]
        agents = {name: pid for name, pid in pids.items() if name.startswith("agent-")}
        assert sorted(_netns_of(pid) for pid in agents.values()) == sorted(saved["netns"]), agents
        assert _netns_of(pids["server"]) == "" and _netns_of(pids["gateway"]) == ""   # the host's
        for model in ("small", "sim-large"):     # the gateway reaches the engines over the veths
            status, text = up.complete(model)
            assert status == 200, f"{model}: {status} {text}"
    finally:
        code = up.stop()
    assert code == 0, "\n".join(up.lines[-30:])
    assert not set(saved["netns"]) & _namespaces() and not (tmp_path / "dev" / "netns.json").exists()


def test_a_taken_gateway_port_is_one_line_naming_the_flag(tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        out = subprocess.run([*LLMGW, "dev", "up", "--dir", str(tmp_path / "dev"), "--gateway-port",
                              str(port)], capture_output=True, text=True, timeout=120)
    assert out.returncode == 1
    text = (out.stdout + out.stderr).strip()
    assert text == f"error: port {port} for the gateway is taken on 127.0.0.1: choose another with --gateway-port"
    assert not (tmp_path / "dev" / "etcd").exists()   # nothing was started


SIM = {"apiVersion": "llmgw.io/v1", "kind": "Model", "metadata": {"name": "solo"},
       "spec": {"replicas": 1, "profiles": [{"engine": "sim", "gpusPerNode": 1}]}}


async def _serves(c: LocalCluster, timeout: float = 150.0) -> None:
    """Apply one sim model and wait (bounded) until the cluster's gateway answers for it."""
    async with Client.from_config(ClientConfig.load(c.admin_config)) as client:
        await client.apply(parse_object(SIM))
    body = json.dumps({"model": "solo", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}).encode()

    async def served() -> bool:
        c.check_alive()
        req = urllib.request.Request(f"{c.gateway_url}/v1/chat/completions", body,
                                     {"content-type": "application/json"})
        with await asyncio.to_thread(urllib.request.urlopen, req, timeout=10) as resp:
            return resp.status == 200
    await until(served, f"{c.dir}: model solo served", timeout=timeout, interval=0.5, retry=(OSError,))


async def _node(c: LocalCluster):
    async with Client.from_config(ClientConfig.load(c.admin_config)) as client:
        return await client.get(Node, "node01")


async def _etcd_is_tls_with_client_certificates(c: LocalCluster) -> None:
    assert c.etcd.endpoint.startswith("https://")
    anonymous = Store(c.etcd.endpoint, ca=c.etcd_ca)
    with pytest.raises(StoreUnavailable, match="refused this client's TLS certificate"):
        await anonymous.connect()
    await anonymous.close()
    cert, key = c.etcd_certs["dev-admin"]
    async with Store(c.etcd.endpoint, ca=c.etcd_ca, cert=cert, key=key) as store:
        assert (await store.get(Node, "node01")).name == "node01"


def test_two_dev_clusters_side_by_side(tmp_path):
    """Same node names, one machine: each cluster has its own loopback addresses and engine ports."""
    clusters = [LocalCluster(tmp_path / name, [NodePlan("node01", "ib-a")], gateway_port=free_port())
                for name in ("a", "b")]
    try:
        for c in clusters:
            c.start()

        async def check():
            await asyncio.gather(*(_serves(c) for c in clusters))
            nodes = [await _node(c) for c in clusters]
            assert nodes[0].status.addresses != nodes[1].status.addresses
            ranges = [(n.status.portRange.first, n.status.portRange.last) for n in nodes]
            assert ranges[0][1] < ranges[1][0] or ranges[1][1] < ranges[0][0], ranges
            for c in clusters:
                await _etcd_is_tls_with_client_certificates(c)
        asyncio.run(check())
    finally:
        for c in clusters:
            c.stop()

"""`llmgw dev up --servers 3`: three API servers over the one etcd; cluster.json, the admin's config
and what it prints name them all; with the agent's server killed, its heartbeats and its and the
gateway's watches go on on the others, and `llmgw get nodes` still answers."""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import urllib.request

import pytest
import yaml

from llmgw.dev.cluster import LocalCluster, NodePlan
from llmgw.dev.process import LLMGW, free_port
from tests.dev.test_dev_up import DevUp
from tests.fixtures.poll import until_sync

pytestmark = pytest.mark.timeout(400)


def _metric(address: str, name: str, **labels: str) -> float:
    """The sum of a metric's samples whose labels include `labels`, from a component's /metrics."""
    with urllib.request.urlopen(f"http://{address}/metrics", timeout=10) as resp:
        text = resp.read().decode()
    total = 0.0
    for line in text.splitlines():
        m = re.match(rf"{name}\{{(.*)\}} (\S+)$", line)
        if m and all(f'{k}="{v}"' in m.group(1) for k, v in labels.items()):
            total += float(m.group(2))
    return total


def test_dev_up_with_three_servers_prints_commands_that_use_them_all(tmp_path):
    directory = tmp_path / "dev"
    up = DevUp(directory, free_port(), "--servers", "3", "--nodes", "1", "--no-examples")
    try:
        up.wait_for("Ctrl-C here")
        state = json.loads((directory / "cluster.json").read_text())
        assert len(state["servers"]) == 3 and state["server"] == state["servers"][0]
        assert {"server", "server-2", "server-3"} <= set(state["pids"])
        export = next(line.strip() for line in up.lines if line.strip().startswith("export LLMGW_CONFIG="))
        assert all(url in export for url in state["servers"])    # the servers named where the config is
        config = export.split("=", 1)[1].split()[0]
        assert yaml.safe_load(open(config))["server"] == state["servers"]
        llmgw = next(line.split()[0] for line in up.lines if line.strip().endswith("get nodes"))

        def get_nodes() -> str:   # as printed (the node registers a moment after dev up's "ready")
            done = subprocess.run(["bash", "-c", f"{export}\n{llmgw} get nodes"], capture_output=True, text=True,
                                  timeout=60)
            assert done.returncode == 0, done.stderr
            return done.stdout
        until_sync(lambda: "node01" in get_nodes(), "node01 in the printed command's answer", timeout=60)
    finally:
        code = up.stop()
    assert code == 0, "\n".join(up.lines[-30:])


def test_the_agents_server_killed_its_clients_go_on_on_the_others(tmp_path):
    c = LocalCluster(tmp_path / "dev", [NodePlan("node01", "ib-a")], gateway_port=free_port(), servers=3)
    try:
        c.start()
        names = ["server", "server-2", "server-3"]

        def beats(on: list[str]) -> float:
            return sum(_metric(c.metrics_addresses[n], "llmgw_server_requests_total", verb="heartbeat", code="200")
                       for n in on)
        until_sync(lambda: beats(names) >= 1, "the agent's first heartbeat", timeout=60)
        # the server the agent beats to: its clients spread over the servers, each keeps to its own
        used = max(names, key=lambda n: beats([n]))
        others = [n for n in names if n != used]
        before = beats(others)
        c.stop_process(used, signal.SIGKILL)
        # the agent's heartbeats (every 2 s), its and the gateway's watches move to the others
        until_sync(lambda: beats(others) >= before + 2, "heartbeats on the other servers", timeout=60)
        until_sync(lambda: sum(_metric(c.metrics_addresses[n], "llmgw_server_watches") for n in others) >= 2,
                   "the agent's and the gateway's watches on the other servers", timeout=60)
        done = subprocess.run([*LLMGW, "get", "nodes"], capture_output=True, text=True, timeout=60,
                              env={**os.environ, "LLMGW_CONFIG": str(c.admin_config)})
        assert done.returncode == 0 and "node01" in done.stdout, done.stderr
    finally:
        c.stop()

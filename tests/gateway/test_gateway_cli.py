"""`llmgw gateway` options, and routes loaded from a static manifest file."""
from __future__ import annotations

import json
import socket
import subprocess
import sys
import urllib.error
import urllib.request

import pytest
from click.testing import CliRunner

from llmgw.cli.main import cli
from llmgw.dev.process import free_port
from llmgw.gateway.source import load_static
from llmgw.gateway.table import RoutingTable
from tests.fixtures.gateway import CLI
from tests.fixtures.poll import until_sync

TRACEPARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"

ROUTES = """\
apiVersion: llmgw.io/v1
kind: Model
metadata: {name: llama}
spec: {aliases: [small], profiles: [{engine: sim}]}
---
apiVersion: llmgw.io/v1
kind: Replica
metadata: {name: llama-0}
spec: {model: llama, templateHash: t, profile: {engine: sim}}
status: {phase: Ready, endpoint: "10.0.0.1:30000"}
---
apiVersion: llmgw.io/v1
kind: Replica
metadata: {name: llama-1}
spec: {model: llama, templateHash: t, profile: {engine: sim}}
status: {phase: Starting, endpoint: "10.0.0.2:30000"}
"""


def test_exactly_one_source_is_required(tmp_path):
    routes = tmp_path / "routes.yaml"
    routes.write_text(ROUTES)
    for args in ([], ["--server", "https://127.0.0.1:7443", "--static", str(routes)]):
        result = CliRunner().invoke(cli, ["gateway", "--listen", "127.0.0.1:0", *args])
        assert result.exit_code == 2 and "exactly one of --server" in result.output, result.output
    result = CliRunner().invoke(cli, ["gateway", "--listen", "nowhere", "--static", str(routes)])
    assert result.exit_code == 2 and "expected HOST:PORT" in result.output


def test_static_routes_load_models_and_only_ready_replicas(tmp_path):
    routes = tmp_path / "routes.yaml"
    routes.write_text(ROUTES)
    table = RoutingTable()
    assert load_static(routes, table) == 3
    assert table.resolve("small") == "llama"
    assert [b.endpoint for b in table.backends_for("llama")] == ["10.0.0.1:30000"]


def test_a_taken_listen_address_is_one_line_naming_it(tmp_path):
    routes = tmp_path / "routes.yaml"
    routes.write_text(ROUTES)
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        done = subprocess.run([sys.executable, "-m", "llmgw.cli.main", "gateway", "--listen", f"127.0.0.1:{port}",
                               "--static", str(routes), "--log-level", "warning"],
                              capture_output=True, text=True, timeout=60)
    assert "Traceback" not in done.stderr, done.stderr
    assert (done.returncode, done.stdout) == (1, "")
    assert done.stderr == f"Error: cannot listen on 127.0.0.1:{port} (--listen): Address already in use\n"


def test_an_unknown_listen_host_is_one_line(tmp_path):
    routes = tmp_path / "routes.yaml"
    routes.write_text(ROUTES)
    result = CliRunner().invoke(cli, ["gateway", "--listen", "no-such-host.invalid:0", "--static", str(routes),
                                      "--log-level", "warning"])
    assert result.exit_code == 1, result.output
    assert result.output.startswith("Error: cannot listen on no-such-host.invalid:0 (--listen): ")
    assert result.output.count("\n") == 1, result.output


def _whole_lines(log) -> list[str]:
    """The lines the process has finished writing (a read may catch the last one half-written)."""
    return log.read_text().split("\n")[:-1]


def test_json_logs_carry_the_trace_id_of_the_request_they_are_about(tmp_path):
    """--log-format json: one object per line; a line about a request has its trace id (the client's
    trace, continued by the gateway). The replica's engine refuses connections: two lines say so."""
    refused = free_port()   # nothing listens there
    routes = tmp_path / "routes.yaml"
    routes.write_text(ROUTES.replace('"10.0.0.1:30000"', f'"127.0.0.1:{refused}"'))
    port = free_port()
    log = tmp_path / "gateway.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen([*CLI, "gateway", "--listen", f"127.0.0.1:{port}", "--static", str(routes),
                                 "--log-format", "json"], stdout=out, stderr=subprocess.STDOUT)
    try:
        until_sync(lambda: "gateway listening" in log.read_text(), "the gateway to listen",
                   detail=lambda: log.read_text())
        req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions", b'{"model": "llama", "prompt": "x"}',
                                     {"content-type": "application/json", "traceparent": TRACEPARENT})
        with pytest.raises(urllib.error.HTTPError) as err:
            urllib.request.urlopen(req, timeout=30)
        assert err.value.code == 502
        lines = until_sync(lambda: [json.loads(x) for x in _whole_lines(log)
                                    if "failed before its first byte" in x] or None, "the failure's log lines")
    finally:
        proc.terminate()
        proc.wait(30)
    every = [json.loads(x) for x in log.read_text().splitlines()]   # every line is one JSON object
    assert {"time", "level", "logger", "message"} <= set(every[0])
    assert lines[0]["trace_id"] == "4bf92f3577b34da6a3ce929d0e0e4736" and lines[0]["model"] == "llama"
    assert lines[0]["level"] == "info" and lines[0]["logger"] == "llmgw.gateway.proxy"

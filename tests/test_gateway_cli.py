"""`llmgw gateway` options, and routes loaded from a static manifest file."""
from __future__ import annotations

import socket
import subprocess
import sys

from click.testing import CliRunner

from llmgw.cli.main import cli
from llmgw.gateway.source import load_static
from llmgw.gateway.table import RoutingTable

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

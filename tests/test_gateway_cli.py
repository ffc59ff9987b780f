"""`llmgw gateway` options, and routes loaded from a static manifest file."""
from __future__ import annotations

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

"""Contexts (issue 35): a client config with several clusters, --context on every command, and
`llmgw config get-contexts|current-context|use-context`, against a real server."""
from __future__ import annotations

from pathlib import Path

import yaml

from tests.fixtures.cluster import llmgw, llmgw_ca, shared_api_server  # noqa: F401

NOWHERE = "https://127.0.0.1:1"   # nothing listens on port 1: a context whose server is unreachable


def add_context(server, config: Path, context: str, url: str) -> None:
    llmgw_ca("issue", "admin", f"admin-{context}", "--dir", str(server.pki.dir), "--write-config",
             "--server", url, "--config", str(config), "--context", context)


def test_contexts_pick_the_cluster_of_every_command(shared_api_server, tmp_path):
    config = tmp_path / "config.yaml"
    add_context(shared_api_server, config, "lab", NOWHERE)
    add_context(shared_api_server, config, "prod", shared_api_server.url)

    # the first context written became the current one; a later one is added beside it
    listed = llmgw(config, "config", "get-contexts")
    assert listed.exit_code == 0, listed.output
    assert [line.split() for line in listed.stdout.splitlines()] == [
        ["CURRENT", "NAME", "SERVER"], ["*", "lab", NOWHERE], ["prod", shared_api_server.url]]
    assert llmgw(config, "config", "get-contexts", "-o", "name").stdout.split() == ["lab", "prod"]
    assert llmgw(config, "config", "current-context").stdout.strip() == "lab"

    # the current context (lab) is unreachable; --context prod reaches the server
    out = llmgw(config, "get", "nodes")
    assert out.exit_code == 3 and NOWHERE in out.stderr
    assert llmgw(config, "get", "nodes", "--context", "prod").exit_code == 0

    switched = llmgw(config, "config", "use-context", "prod")
    assert switched.exit_code == 0 and "prod" in switched.stdout
    assert llmgw(config, "config", "current-context").stdout.strip() == "prod"
    assert llmgw(config, "get", "nodes").exit_code == 0
    out = llmgw(config, "get", "nodes", "--context", "lab")
    assert out.exit_code == 3 and NOWHERE in out.stderr

    # rewriting a context replaces it, in place of adding a second of that name
    add_context(shared_api_server, config, "lab", shared_api_server.url)
    doc = yaml.safe_load(config.read_text())
    assert doc["current-context"] == "prod"
    assert [(c["name"], c["server"]) for c in doc["contexts"]] == [
        ("prod", shared_api_server.url), ("lab", shared_api_server.url)]
    assert llmgw(config, "get", "nodes", "--context", "lab").exit_code == 0


def test_a_one_cluster_file_becomes_the_default_context(shared_api_server, tmp_path):
    config = tmp_path / "config.yaml"
    llmgw_ca("issue", "admin", "one", "--dir", str(shared_api_server.pki.dir), "--write-config",
             "--server", shared_api_server.url, "--config", str(config))
    assert llmgw(config, "config", "get-contexts", "-o", "name").stdout == ""
    out = llmgw(config, "get", "nodes", "--context", "lab")
    assert out.exit_code == 2 and "no contexts in this file" in out.stderr and "'lab'" in out.stderr

    add_context(shared_api_server, config, "lab", NOWHERE)
    assert llmgw(config, "config", "current-context").stdout.strip() == "default"
    assert llmgw(config, "get", "nodes").exit_code == 0          # the cluster it held, kept as "default"
    assert llmgw(config, "get", "nodes", "--context", "lab").exit_code == 3


def test_unknown_or_unset_context_and_bad_files_are_usage_errors(shared_api_server, tmp_path):
    config = tmp_path / "config.yaml"
    add_context(shared_api_server, config, "prod", shared_api_server.url)
    add_context(shared_api_server, config, "lab", shared_api_server.url)

    out = llmgw(config, "get", "nodes", "--context", "stage")
    assert out.exit_code == 2
    assert out.stderr.strip() == f"error: {config}: --context: no context 'stage' (contexts: prod, lab)"
    out = llmgw(config, "config", "use-context", "stage")
    assert out.exit_code == 2 and "no context 'stage' (contexts: prod, lab)" in out.stderr
    assert llmgw(config, "config", "current-context").stdout.strip() == "prod"   # unchanged

    doc = yaml.safe_load(config.read_text())
    del doc["current-context"]
    config.write_text(yaml.safe_dump(doc))
    out = llmgw(config, "get", "nodes")
    assert out.exit_code == 2 and "current-context: not set" in out.stderr and "prod, lab" in out.stderr
    assert llmgw(config, "get", "nodes", "--context", "lab").exit_code == 0
    assert llmgw(config, "config", "current-context").exit_code == 2

    doc["contexts"][1]["name"] = "prod"
    config.write_text(yaml.safe_dump(doc))
    out = llmgw(config, "get", "nodes", "--context", "prod")
    assert out.exit_code == 2 and "contexts[1].name: 'prod' is contexts[0]'s name too" in out.stderr

    doc["contexts"][1] = {"name": "lab", "server": shared_api_server.url, "ca": "ca.crt", "cert": "x", "key": "y"}
    config.write_text(yaml.safe_dump(doc))
    out = llmgw(config, "get", "nodes", "--context", "lab")
    assert out.exit_code == 2 and f"contexts[1].ca: {tmp_path / 'ca.crt'} does not exist" in out.stderr
    doc["contexts"][1]["token"] = "t"
    config.write_text(yaml.safe_dump(doc))
    out = llmgw(config, "config", "get-contexts")
    assert out.exit_code == 2 and "contexts[1]: unknown field 'token'" in out.stderr


def test_context_without_write_config_is_refused(shared_api_server, tmp_path):
    from click.testing import CliRunner

    from llmgw.cli.ca import ca
    out = CliRunner().invoke(ca, ["issue", "admin", "x", "--dir", str(shared_api_server.pki.dir),
                                  "--context", "lab"])
    assert out.exit_code == 2 and "add --write-config" in out.output

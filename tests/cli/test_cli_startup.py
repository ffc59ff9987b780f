"""Fast start (issue 35), held by what a command imports rather than by a clock (the figures are
hack/bench/cli.py's): `llmgw version`, `get` and `apply -f`, run for real against a real server,
import no other command's modules, no aiohttp (llmgw.client.oneshot), no rich into a pipe, and
`version` not even pydantic; `llmgw --help` lists the commands without importing them."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.fixtures.cluster import admin_cli_config, shared_api_server  # noqa: F401

# Runs the real command group, then prints the modules it imported (after it exits, as it would).
PROBE = """
import atexit, json, sys
atexit.register(lambda: print(json.dumps(sorted(sys.modules)), file=sys.stderr))
from llmgw.cli.main import main
sys.argv = ["llmgw", *sys.argv[1:]]
main()
"""
# (packages whose __init__ is a docstring, such as llmgw.cmd, are found to tell whether a command
# exists: their modules are what must not load)
NEVER = ("aiohttp", "rich", "cryptography", "llmgw.agent.", "llmgw.server.", "llmgw.gateway.", "llmgw.cmd.",
         "llmgw.store", "llmgw.pki", "controllers", "llmgw.cli.top", "llmgw.cli.ca", "llmgw.cli.describe")


def imported(config, *args: str) -> set[str]:
    out = subprocess.run([sys.executable, "-c", PROBE, *args], capture_output=True, text=True, timeout=60,
                         env={**os.environ, "LLMGW_CONFIG": str(config)})
    assert out.returncode == 0, out.stderr
    return set(json.loads(out.stderr.strip().splitlines()[-1]))


@pytest.mark.parametrize("args", [("version",), ("get", "nodes"), ("apply", "-f", "MANIFEST"), ("--help",)])
def test_a_command_imports_what_it_needs(config, args):
    manifest = config.parent / "startup.yaml"
    manifest.write_text("apiVersion: llmgw.io/v1\nkind: Model\nmetadata: {name: startup}\n"
                        "spec: {replicas: 0, profiles: [{engine: sim}]}\n")
    modules = imported(config, *[str(manifest) if a == "MANIFEST" else a for a in args])
    loaded = sorted(m for m in modules if any(m == n or m.startswith(n if n.endswith(".") else n + ".")
                                              for n in NEVER))
    assert loaded == []
    if args[0] != "apply":
        assert "llmgw.cli.apply" not in modules
    if args == ("version",):
        assert not any(m.startswith(("pydantic", "llmgw.api", "llmgw.client", "yaml")) for m in modules)


def test_help_summaries_read_from_the_source_are_clicks():
    import click

    from llmgw.cli.main import COMMANDS, cli
    from llmgw.cli.summary import summary
    ctx = click.Context(cli)
    read = {name: summary(target, 50) for name, target in COMMANDS.items()}
    assert sorted(name for name, text in read.items() if text is None) == ["drain"]   # made by a factory
    for name, text in read.items():
        command = cli.get_command(ctx, name)
        assert command is not None and text in (None, command.get_short_help_str(50)), name

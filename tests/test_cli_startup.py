"""Fast start (issue 35), held by what a command imports rather than by a clock (the figures are
hack/bench/cli.py's): `llmgw version`, `get` and `apply -f`, run for real against a real server,
import no other command's modules, no aiohttp (llmgw.client.oneshot), no rich into a pipe, and
`version` not even pydantic."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.helpers.cluster import admin_cli_config, shared_api_server  # noqa: F401

# Runs the real command group, then prints the modules it imported (after it exits, as it would).
PROBE = """
import atexit, json, sys
atexit.register(lambda: print(json.dumps(sorted(sys.modules)), file=sys.stderr))
from llmgw.cli.main import main
sys.argv = ["llmgw", *sys.argv[1:]]
main()
"""
NEVER = ("aiohttp", "rich", "cryptography", "llmgw.agent", "llmgw.server", "llmgw.gateway", "llmgw.cmd",
         "llmgw.store", "llmgw.pki", "controllers", "llmgw.cli.top", "llmgw.cli.ca", "llmgw.cli.describe")


def imported(config, *args: str) -> set[str]:
    out = subprocess.run([sys.executable, "-c", PROBE, *args], capture_output=True, text=True, timeout=60,
                         env={**os.environ, "LLMGW_CONFIG": str(config)})
    assert out.returncode == 0, out.stderr
    return set(json.loads(out.stderr.strip().splitlines()[-1]))


@pytest.mark.parametrize("args", [("version",), ("get", "nodes"), ("apply", "-f", "MANIFEST")])
def test_a_command_imports_what_it_needs(config, args):
    manifest = config.parent / "startup.yaml"
    manifest.write_text("apiVersion: llmgw.io/v1\nkind: Model\nmetadata: {name: startup}\n"
                        "spec: {replicas: 0, profiles: [{engine: sim}]}\n")
    modules = imported(config, *[str(manifest) if a == "MANIFEST" else a for a in args])
    loaded = sorted(m for m in modules if any(m == n or m.startswith(n + ".") for n in NEVER))
    assert loaded == []
    if args[0] != "apply":
        assert "llmgw.cli.apply" not in modules
    if args == ("version",):
        assert not any(m.startswith(("pydantic", "llmgw.api", "llmgw.client", "yaml")) for m in modules)

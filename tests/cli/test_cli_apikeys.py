"""`llmgw create apikey` / `get apikeys` / `describe apikey` / `delete apikey`: the real CLI against a
real server: the secret printed once and only its hash stored, never shown again."""
from __future__ import annotations

import asyncio

import yaml

from llmgw.api import ApiKey
from llmgw.api.secrets import key_name, verify_secret
from tests.fixtures.cluster import admin_cli_config, llmgw, shared_api_server  # noqa: F401


def test_create_prints_the_secret_once_and_stores_its_hash(config, shared_api_server):
    out = llmgw(config, "create", "apikey", "team-a", "--owner", "team-a@example.com", "--model", "llama",
                "--model-selector", "tier=gold", "--rpm", "600", "--tpm", "20000", "--concurrency", "4",
                "--priority", "critical", "--expires", "30d")
    assert out.exit_code == 0, out.output
    secret = out.stdout.strip()
    assert key_name(secret) == "team-a"

    async def stored() -> ApiKey:
        async with shared_api_server.client() as c:
            return await c.get(ApiKey, "team-a")
    key = asyncio.run(stored())
    assert secret not in key.model_dump_json()
    assert verify_secret(secret, key.spec.secretHash)
    assert key.spec.limits.requestsPerMinute == 600 and key.spec.priorityClass == "critical"

    table = llmgw(config, "get", "apikeys")
    assert table.exit_code == 0, table.output
    header, row = table.stdout.splitlines()[:2]
    assert header.split() == ["NAME", "OWNER", "MODELS", "LIMITS", "PRIORITY", "EXPIRES", "LAST-USE", "AGE"]
    assert row.split()[:5] == ["team-a", "team-a@example.com", "llama,tier=gold",
                               "rpm=600,tpm=20000,concurrency=4", "critical"]
    for view in (table.stdout, llmgw(config, "describe", "apikey", "team-a").stdout,
                 llmgw(config, "get", "apikey", "team-a", "-o", "yaml").stdout):
        assert secret not in view
    assert yaml.safe_load(llmgw(config, "get", "apikey", "team-a", "-o", "yaml").stdout)["spec"]["owner"]

    assert llmgw(config, "delete", "apikey", "team-a").exit_code == 0
    assert "team-a" not in llmgw(config, "get", "apikeys").stdout


def test_bad_flags_are_one_line_errors(config):
    out = llmgw(config, "create", "apikey", "bad", "--owner", "x", "--expires", "someday")
    assert out.exit_code != 0 and "--expires 'someday'" in out.output and "Traceback" not in out.output
    out = llmgw(config, "create", "apikey", "bad", "--owner", "x", "--model-selector", "tier")
    assert out.exit_code != 0 and "LABEL=VALUE" in out.output
    out = llmgw(config, "create", "apikey", "Not_A_Name", "--owner", "x")
    assert out.exit_code != 0 and "metadata.name" in out.output and "Traceback" not in out.output


def test_create_and_get_warn_when_no_gateway_enforces_keys(config):
    """No gateway runs with --watch-api-keys here: one line on stderr says so (with one that does:
    tests/dev/test_dev_up.py); the secret alone is on stdout."""
    out = llmgw(config, "create", "apikey", "unenforced", "--owner", "x")
    assert out.exit_code == 0, out.output
    warning = "warning: no live gateway enforces API keys (none runs with --watch-api-keys)"
    assert [line for line in out.stderr.splitlines() if "warning" in line] == [out.stderr.splitlines()[-1]]
    assert out.stderr.splitlines()[-1].startswith(warning) and out.stdout.strip().startswith("llmgw_unenforced_")
    for args in (["get", "apikeys"], ["get", "apikey", "unenforced", "-o", "yaml"]):
        got = llmgw(config, *args)
        assert got.exit_code == 0 and got.stderr.startswith(warning) and len(got.stderr.splitlines()) == 1, got.output


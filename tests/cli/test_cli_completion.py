"""Shell completion (issue 35): the scripts of `llmgw completion bash|zsh|fish`, and what the real
`llmgw` offers through click's protocol (_LLMGW_COMPLETE, COMP_WORDS, COMP_CWORD): commands,
kinds, the names of objects listed from a real server, and contexts."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.fixtures.cluster import admin_cli_config, llmgw, llmgw_ca, shared_api_server  # noqa: F401

BIN = Path(sys.executable).parent
LLMGW = str(BIN / "llmgw")


def complete(config: Path | None, words: str, cword: int | str, shell: str = "bash") -> subprocess.CompletedProcess:
    """The real `llmgw` asked for completions as the shell's script asks: what it printed."""
    env = {k: v for k, v in os.environ.items() if k not in ("LLMGW_CONFIG", "_LLMGW_COMPLETE")}
    env.update({"_LLMGW_COMPLETE": f"{shell}_complete", "COMP_WORDS": words, "COMP_CWORD": str(cword)})
    if config is not None:
        env["LLMGW_CONFIG"] = str(config)
    out = subprocess.run([LLMGW], env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stderr == "", out.stderr
    return out


def offered(config: Path | None, words: str, cword: int) -> list[str]:
    """bash's candidates: click prints `type,value` lines."""
    return [line.split(",", 1)[1] for line in complete(config, words, cword).stdout.splitlines()
            if line.startswith("plain,")]


@pytest.fixture(scope="module")
def models(config):
    docs = "".join(f"---\napiVersion: llmgw.io/v1\nkind: Model\nmetadata: {{name: {n}}}\n"
                   "spec: {replicas: 0, profiles: [{engine: sim}]}\n" for n in ("comp-a", "comp-b", "other-c"))
    path = config.parent / "models.yaml"
    path.write_text(docs)
    assert llmgw(config, "apply", "-f", str(path)).exit_code == 0
    return ["comp-a", "comp-b", "other-c"]


@pytest.mark.parametrize("shell,marker", [
    ("bash", "complete -o nosort -F _llmgw_completion llmgw"),
    ("zsh", "#compdef llmgw"),
    ("fish", "complete --no-files --command llmgw"),
])
def test_completion_prints_each_shells_script(shell, marker):
    out = subprocess.run([LLMGW, "completion", shell], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and marker in out.stdout and "_LLMGW_COMPLETE" in out.stdout
    bad = subprocess.run([LLMGW, "completion", "tcsh"], capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "'tcsh' is not one of 'bash', 'zsh', 'fish'" in bad.stderr


def test_commands_and_kinds(config):
    assert offered(config, "llmgw ge", 1) == ["get"]
    assert {"config", "completion", "cordon"} <= set(offered(config, "llmgw c", 1))
    assert offered(config, "llmgw get ", 2) == ["nodes", "models", "replicas", "shards", "apikeys", "gitsources",
                                               "roles", "rolebindings", "adapters"]
    assert offered(config, "llmgw describe re", 2) == ["replicas"]
    assert offered(config, "llmgw get models --o", 3) == ["--output"]


def test_object_names_come_from_the_cluster(config, models):
    assert offered(config, "llmgw get models ", 3) == models
    assert offered(config, "llmgw get mo comp-", 3) == ["comp-a", "comp-b"]
    assert offered(config, "llmgw describe model other", 3) == ["other-c"]
    assert offered(config, "llmgw delete models comp-a comp", 4) == ["comp-a", "comp-b"]
    # the connection flags on the line are the ones the listing uses
    assert offered(None, f"llmgw get models --config {config} comp-", 5) == ["comp-a", "comp-b"]


def test_events_for_and_logs_complete_kinds_then_names(config, models):
    assert offered(config, "llmgw events --for mo", 3) == ["models/"]
    assert offered(config, "llmgw events --for models/comp-", 3) == ["models/comp-a", "models/comp-b"]
    assert offered(config, "llmgw logs shard/", 2) == []          # no shard in this cluster: nothing


def test_bash_script_fills_compreply(config, models):
    """The printed bash script, sourced in a real bash, asking the real llmgw."""
    script = ('source <(llmgw completion bash)\n'
              'COMP_WORDS=(llmgw get models comp-); COMP_CWORD=3\n'
              '_llmgw_completion llmgw\n'
              'printf "%s\\n" "${COMPREPLY[@]}"\n')
    env = {**os.environ, "PATH": f"{BIN}:{os.environ['PATH']}", "LLMGW_CONFIG": str(config)}
    out = subprocess.run(["bash", "-c", script], env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["comp-a", "comp-b"]


def test_zsh_and_fish_protocols(config, models):
    zsh = complete(config, "llmgw get models comp-", 3, "zsh").stdout.splitlines()
    assert zsh == ["plain", "comp-a", "_", "plain", "comp-b", "_"]
    fish = complete(config, "llmgw get models comp-", "comp-", "fish").stdout.splitlines()
    assert fish == ["plain,comp-a", "plain,comp-b"]


def test_contexts_complete_and_pick_the_cluster(shared_api_server, tmp_path, models):
    config = tmp_path / "config.yaml"
    for context, url in (("prod", shared_api_server.url), ("lab", "https://127.0.0.1:1")):
        llmgw_ca("issue", "admin", f"comp-{context}", "--dir", str(shared_api_server.pki.dir), "--write-config",
                 "--server", url, "--config", str(config), "--context", context)
    assert offered(config, "llmgw get models --context ", 4) == ["prod", "lab"]
    assert offered(config, "llmgw config use-context l", 3) == ["lab"]
    assert offered(config, "llmgw get models --context prod comp-", 5) == ["comp-a", "comp-b"]
    # an unreachable cluster, or no config at all: nothing offered, and nothing on stderr
    assert offered(config, "llmgw get models --context lab comp-", 5) == []
    assert offered(tmp_path / "none.yaml", "llmgw get models comp-", 3) == []
    assert offered(tmp_path / "none.yaml", "llmgw get models --context ", 4) == []
    assert offered(config, "llmgw get pods ", 3) == []

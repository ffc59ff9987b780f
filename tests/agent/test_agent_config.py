"""Agent configuration: the YAML file, flag overrides, and errors that name the key and file."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from llmgw.agent.config import ConfigError, load_config
from llmgw.agent.fabrics import FabricSpec

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "agent.yaml"


def write(tmp_path, text):
    path = tmp_path / "agent.yaml"
    path.write_text(text)
    return str(path)


def test_the_shipped_example_loads():
    assert EXAMPLE.read_text().splitlines()[0] == "# llmgw agent configuration"
    cfg = load_config(str(EXAMPLE))
    assert cfg.node == "gpu-01"
    assert cfg.server_url == "https://control.example.com:7443"
    assert cfg.fabrics == [FabricSpec("ib-a")]
    assert cfg.engines["llama-server"] == "/opt/llama.cpp/bin/llama-server"
    assert (cfg.port_range.first, cfg.port_range.last) == (30000, 32767)
    assert cfg.drain_delay == 2.0 and cfg.stop_grace_period == 30.0


def test_flags_override_the_file(tmp_path):
    path = write(tmp_path, "node: a\nstate-dir: /x\nfabrics: [ib-a]\nengines: {vllm: /v, ray: /r}\n"
                           "port-range: 30000-30100\n")
    cfg = load_config(path, {"node": "b", "state_dir": None, "fabrics": ["ib-b:mlx5_2,mlx5_3"],
                             "engines": {"vllm": "/opt/v"}, "port_range": "40000-40010", "drain_delay": "500ms"})
    assert cfg.node == "b"
    assert cfg.state_dir == "/x"                       # None: the flag was not given
    assert cfg.fabrics == [FabricSpec("ib-b", ("mlx5_2", "mlx5_3"))]
    assert cfg.engines == {"vllm": "/opt/v", "ray": "/r"}
    assert (cfg.port_range.first, cfg.port_range.last) == (40000, 40010)
    assert cfg.drain_delay == 0.5


def test_fabrics_in_mapping_form(tmp_path):
    cfg = load_config(write(tmp_path, "fabrics:\n  - {name: ib-b, adapters: [mlx5_2, 'mlx5_3:1']}\n"))
    assert cfg.fabrics == [FabricSpec("ib-b", ("mlx5_2", "mlx5_3:1"))]


def test_llamacpp_is_an_alias_of_llama_server(tmp_path):
    assert load_config(None, {"engines": {"llamacpp": "/l"}}).engines == {"llama-server": "/l"}


@pytest.mark.parametrize("text, message", [
    ("stat-dir: /x\n", "stat-dir: Extra inputs are not permitted"),
    ("port-range: 32767-30000\n", "port-range: port range 32767-30000 is empty"),
    ("port-range: lots\n", "port-range: 'lots' is not a port range"),
    ("drain-delay: soon\n", "drain-delay: 'soon' is not a duration"),
    ("engines: {vlm: /v}\n", "engines: unknown engine executable 'vlm'"),
    ("node: GPU_01\n", "node: 'GPU_01' is not a DNS-1123 label"),
    ("fabrics: [ib-a, 'Bad:x']\n", "fabric name 'Bad' is not a DNS-1123 label"),
    ("- a\n- b\n", "expected a mapping of settings, found list"),
])
def test_errors_name_the_file_and_the_key(tmp_path, text, message):
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as err:
        load_config(path)
    assert str(err.value).startswith(f"{path}: ")
    assert message in str(err.value)


def test_missing_file_is_named(tmp_path):
    with pytest.raises(ConfigError, match=f"cannot read config file {tmp_path}/nope.yaml"):
        load_config(str(tmp_path / "nope.yaml"))


def test_connection_settings_are_required_to_run(tmp_path):
    cfg = load_config(None, {"server": "control", "ca": str(tmp_path / "ca.crt")})
    with pytest.raises(ConfigError, match="missing cert, key: set them in the config file or pass --cert --key"):
        cfg.require_connection()
    assert cfg.server_url == "https://control:7443"
    cfg = load_config(None, {"server": "control", "ca": str(tmp_path / "ca.crt"), "cert": "c", "key": "k"})
    with pytest.raises(ConfigError, match=f"ca file not found: {tmp_path}/ca.crt"):
        cfg.require_connection()


# Files that cannot be read as a config: `llmgw agent --config FILE` (the real command, in its
# own process) prints "Error: FILE: PROBLEM" and exits 1, with no traceback.
UNREADABLE = {
    "binary.yaml": (b"node: a\n" + bytes(range(0x80, 0x90)), "not UTF-8 text (byte 0x80 at offset 8)"),
    "latin1.yaml": ("node: a\nlabels: {site: k\u00f8benhavn}\n".encode("latin-1"),
                    "not UTF-8 text (byte 0xf8 at offset 24)"),
    "deep.yaml": (b"labels: " + b"[" * 5000 + b"]" * 5000 + b"\n", "nested deeper than 64 levels"),
    "duplicate.yaml": (b"node: a\nstate-dir: /x\nnode: b\n", "node: duplicate key (line 3)"),
    "two-documents.yaml": (b"node: a\n---\nnode: b\n", "2 YAML documents; the agent reads one"),
    "not-yaml.yaml": (b"node: [a\n", "not valid YAML at line 2"),
}


@pytest.mark.parametrize("name", sorted(UNREADABLE))
def test_an_unreadable_config_is_one_line_from_the_agent_command(tmp_path, name):
    content, problem = UNREADABLE[name]
    path = tmp_path / name
    path.write_bytes(content)
    done = subprocess.run([sys.executable, "-m", "llmgw.cli.main", "agent", "--config", str(path), "--discover"],
                          capture_output=True, text=True, timeout=60)
    assert "Traceback" not in done.stderr, done.stderr
    assert done.returncode == 1 and done.stdout == ""
    assert done.stderr.startswith(f"Error: {path}: ") and done.stderr.count("\n") == 1, done.stderr
    assert problem in done.stderr


def test_an_empty_config_file_means_every_default(tmp_path):
    cfg = load_config(write(tmp_path, ""))
    assert cfg.state_dir == "/var/lib/llmgw/agent" and cfg.fabrics == []

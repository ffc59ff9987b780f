"""`llmgw ctl fit`: a Model's GPU memory per GPU, offline from its files."""
from __future__ import annotations

from pathlib import Path

from click.testing import CliRunner

from llmgw.cli.ctl import ctl
from tests.fixtures.tiny_safetensors import tiny_llama

GiB = 1 << 30


def manifest(tmp_path: Path, source: Path) -> str:
    path = tmp_path / "model.yaml"
    path.write_text(f"apiVersion: llmgw.io/v1\nkind: Model\nmetadata: {{name: tiny}}\nspec:\n  source: {source}\n"
                    "  profiles:\n  - {engine: vllm, gpusPerNode: 2}\n  - {engine: llamacpp, gpusPerNode: 1}\n")
    return str(path)


def test_fit_prints_each_profiles_breakdown_and_context(tmp_path: Path):
    tiny_llama(tmp_path / "tiny")   # 8,130,560 bytes of tensors; KV 1,024 B/token unsplit
    out = CliRunner().invoke(ctl, ["fit", "-f", manifest(tmp_path, tmp_path / "tiny"), "--gpu-memory", "24"])
    assert out.exit_code == 0, out.output
    header, vllm, llama = (line.split() for line in out.output.splitlines())
    assert header == ["MODEL", "PROFILE", "ENGINE", "TP", "PP", "WEIGHTS", "OVERHEAD", "KV/TOKEN", "NEEDED", "CONTEXT"]
    # vLLM at tp=2: half the weights, 2 GiB overhead, one of two KV heads per rank
    assert vllm == ["tiny", "0", "vllm", "2", "1", "0.0", "GiB", "2.0", "GiB", "512", "B", "2.0", "GiB",
                    str((24 * GiB - 8_130_560 // 2 - 2 * GiB) // 512)]
    # llama.cpp on one GPU: the layers all on it, 512 MiB overhead
    assert llama[-1] == str((24 * GiB - 8_130_560 - GiB // 2) // 1024)


def test_fit_refuses_in_one_line_what_it_cannot_read(tmp_path: Path):
    out = CliRunner().invoke(ctl, ["fit", "-f", manifest(tmp_path, tmp_path / "absent")])
    assert out.exit_code != 0
    assert out.output.strip().splitlines() == [
        f"error: model tiny: spec.source '{tmp_path / 'absent'}' is not a directory here "
        "(only local files are estimated yet)"]
    tiny_llama(tmp_path / "tiny")
    (tmp_path / "tiny" / "model-00002-of-00002.safetensors").write_bytes(b"\x00")
    out = CliRunner().invoke(ctl, ["fit", "-f", manifest(tmp_path, tmp_path / "tiny")])
    assert out.exit_code != 0
    assert "model-00002-of-00002.safetensors: shorter than a safetensors header" in out.output
    assert "Traceback" not in out.output


def test_fit_needs_the_kv_of_the_context_the_args_set(tmp_path: Path):
    tiny_llama(tmp_path / "tiny")
    path = tmp_path / "long.yaml"
    path.write_text(f"apiVersion: llmgw.io/v1\nkind: Model\nmetadata: {{name: long}}\nspec:\n"
                    f"  source: {tmp_path / 'tiny'}\n"
                    "  profiles:\n  - {engine: vllm, gpusPerNode: 2, args: [--max-model-len, '2097152']}\n")
    out = CliRunner().invoke(ctl, ["fit", "-f", str(path)])
    assert out.exit_code == 0, out.output
    # 2 GiB overhead + 1 GiB of KV (512 B/token x 2 Mi tokens) + 3.9 MiB of weights
    assert out.output.splitlines()[1].split()[11:13] == ["3.0", "GiB"]

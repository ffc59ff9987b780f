"""`llmgw ctl fit`: a Model's GPU memory per GPU, offline from its files."""
from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from click.testing import CliRunner

from llmgw.cli.ctl import ctl
from llmgw.engines import ENGINES
from tests.fixtures.architectures import (
    LLAMA_31_8B,
    LLAMA_31_70B,
    MISTRAL_Q4_K_M_SIZE,
    files,
    write,
    write_mistral_q4_k_m,
)
from tests.fixtures.tiny_safetensors import tiny_llama
from tests.fixtures.weights_origin import WeightsOrigin, origin  # noqa: F401 the fixture

EXAMPLES = Path(__file__).parents[2] / "examples" / "models"

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
        f"error: model tiny: {tmp_path / 'absent'}: no such directory or file here"]
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
async def test_fit_on_three_examples(tmp_path: Path, origin: WeightsOrigin, monkeypatch: pytest.MonkeyPatch):
    """examples/models/: the 70B on two nodes, the GGUF on llama.cpp (their /models/ paths here the
    fixtures' checkpoints of those models), and the LoRA base from the hub, read before any pull."""
    write(tmp_path / "Meta-Llama-3.1-70B-Instruct", LLAMA_31_70B)
    write_mistral_q4_k_m(tmp_path / "mistral-7b-instruct-v0.3.Q4_K_M.gguf")
    origin.add_repo("meta-llama/Llama-3.1-8B-Instruct", dict(files(LLAMA_31_8B)))
    monkeypatch.setenv("HF_ENDPOINT", origin.url)
    paths = []
    for name in ("vllm-70b-mp.yaml", "llamacpp-1gpu.yaml", "vllm-lora.yaml"):
        paths += ["-f", str(tmp_path / name)]
        (tmp_path / name).write_text((EXAMPLES / name).read_text().replace("/models/", f"{tmp_path}/"))
    out = await asyncio.to_thread(CliRunner().invoke, ctl, ["fit", *paths, "--gpu-memory", "80"])
    assert out.exit_code == 0, out.output
    rows = [line.split() for line in out.output.splitlines()[1:]]
    vllm, llama = ENGINES["vllm"].memory_overhead[0], ENGINES["llamacpp"].memory_overhead[0]
    # tp=8 x pp=2: a sixteenth of the weights, 40 layers of one KV head (2 x 128 x 2 B) a GPU; NEEDED
    # counts the KV of its --max-model-len, 32768 tokens (0.6 GiB)
    weights = LLAMA_31_70B.total_size // 16
    assert rows[0] == ["llama-3-70b", "0", "vllm", "8", "2", "8.2", "GiB", "2.0", "GiB", "20480", "B", "10.8", "GiB",
                       str((80 * GiB - weights - vllm) // 20480)]
    # one GPU, every layer's 8 KV heads in f16; the KV of its --ctx-size, 8192 tokens (1 GiB)
    assert rows[1] == ["mistral-7b-q4", "0", "llamacpp", "1", "1", "4.1", "GiB", "0.5", "GiB", "131072", "B",
                       "5.6", "GiB", str((80 * GiB - MISTRAL_Q4_K_M_SIZE - llama) // 131072)]
    assert rows[2] == ["llama-8b", "0", "vllm", "1", "1", "15.0", "GiB", "2.0", "GiB", "131072", "B", "17.5", "GiB",
                       str((80 * GiB - LLAMA_31_8B.total_size - vllm) // 131072)]
    assert all(r.range for r in origin.requests(suffix=".safetensors"))    # the hub's shards: headers only


def test_fit_at_a_tp_of_ones_choosing_on_named_gpus(tmp_path: Path):
    """--tp N instead of the profile's split; --gpu NAME:GIB a context column each, '-' where the GPU
    cannot hold what placement needs; a malformed --gpu is one line naming it."""
    tiny_llama(tmp_path / "tiny")
    path = manifest(tmp_path, tmp_path / "tiny")
    out = CliRunner().invoke(ctl, ["fit", "-f", path, "--tp", "1", "--gpu", "T4:1", "--gpu", "NVIDIA A10G:24"])
    assert out.exit_code == 0, out.output
    header, vllm, llama = out.output.splitlines()
    assert header.split()[-3:] == ["T4", "NVIDIA", "A10G"]
    # vLLM at tp=1: the whole weights and both KV heads (1,024 B/token); its 2 GiB overhead is past a 1 GiB T4
    assert vllm.split()[3] == "1" and vllm.split()[9:11] == ["1024", "B"]
    assert vllm.split()[-2:] == ["-", str((24 * GiB - 8_130_560 - 2 * GiB) // 1024)]
    assert llama.split()[-2:] == [str((memory - 8_130_560 - GiB // 2) // 1024) for memory in (GiB, 24 * GiB)]
    bad = CliRunner().invoke(ctl, ["fit", "-f", path, "--gpu", "H100"])
    assert bad.exit_code == 2 and "'H100' is not NAME:GIB (say H100:80)" in bad.output

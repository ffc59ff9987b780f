"""Will it fit over real architectures (llmgw/fit.py): checkpoints built from the published shapes
(tests/fixtures/architectures.py: config.json values, tensor names, shapes and dtypes, data a hole).

Weights: the published total of each checkpoint, `metadata.total_size` of its
`model.safetensors.index.json` on the Hugging Face hub (the shards' tensor bytes, headers
excluded), is what the headers add up to, to the byte. GGUF: llama-server's `meta.size` for the file.

KV: what vLLM's KV cache specs give (vllm/v1/kv_cache_interface.py at commit
001cabc1be16a59a70d720ed61a13b678c060a18), restated below from that source and not from llmgw:
`FullAttentionSpec.real_page_size_bytes` (= block_size x num_kv_heads x (head_size + head_size_v) x
dtype size), `MLAAttentionSpec.real_page_size_bytes` (= block_size x num_kv_heads x head_size x dtype
size, num_kv_heads 1 and head_size kv_lora_rank + qk_rope_head_dim), SlidingWindowSpec's page as the
full one's, over the layers of one pipeline stage (vllm/distributed/utils.py get_pp_indices), with
num_kv_heads per rank = max(1, total // tp) (ModelConfig.get_num_kv_heads).
"""
from __future__ import annotations

import struct
from pathlib import Path

import pytest

from llmgw.engines import ENGINES
from llmgw.fit import ShapeError, estimate, kv_cache_dtype, pp_layers, read_shape
from tests.fixtures.architectures import (
    ARCHS,
    DEEPSEEK_V2_LITE,
    GEMMA2_9B,
    GPT_OSS_20B,
    LLAMA_31_8B,
    LLAMA_31_70B,
    MISTRAL_Q4_K_M_PARAMS,
    MISTRAL_Q4_K_M_SIZE,
    MIXTRAL_8X7B,
    QWEN3_8B,
    QWEN3_30B_A3B,
    Arch,
    files,
    write,
    write_mistral_q4_k_m,
)

BLOCK = 16     # vLLM's default block size; the per-token figure does not depend on it


def full_attention_page(num_kv_heads: int, head_size: int, dtype_size: int) -> int:
    """FullAttentionSpec.real_page_size_bytes (head_size_v = head_size)."""
    return BLOCK * num_kv_heads * (head_size + head_size) * dtype_size


def mla_page(head_size: int, dtype_size: int) -> int:
    """MLAAttentionSpec.real_page_size_bytes (num_kv_heads 1)."""
    return BLOCK * 1 * head_size * dtype_size


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("archs")
    return {a.repo: write(root / a.repo, a) for a in ARCHS}


@pytest.mark.parametrize("arch", ARCHS, ids=lambda a: a.repo)
def test_weight_bytes_are_the_published_total(arch: Arch, checkpoints: dict[str, Path]):
    shape = read_shape(checkpoints[arch.repo])
    assert shape.weight_bytes == arch.total_size
    # and the files hold exactly that past their headers (each one's size less 8 and its header)
    shards = sorted(checkpoints[arch.repo].glob("*.safetensors"))
    assert len(shards) == arch.shards
    past = 0
    for f in shards:
        with f.open("rb") as r:
            (length,) = struct.unpack("<Q", r.read(8))
        past += f.stat().st_size - 8 - length
    assert past == arch.total_size


def test_only_the_files_the_index_names_count(tmp_path: Path):
    # Mistral's repositories hold the weights twice: consolidated.safetensors beside the shards the
    # index names; vLLM loads the shards alone (filter_duplicate_safetensors_files)
    directory = write(tmp_path, LLAMA_31_8B)
    first = files(LLAMA_31_8B)["model-00001-of-00004.safetensors"]
    with (directory / "consolidated.safetensors").open("wb") as f:
        f.write(first.head)
        f.truncate(first.size)
    assert read_shape(directory).weight_bytes == LLAMA_31_8B.total_size
    (directory / "model.safetensors.index.json").unlink()
    assert read_shape(directory).weight_bytes > LLAMA_31_8B.total_size
    (directory / "model.safetensors.index.json").write_text("[]")
    with pytest.raises(ShapeError, match="model.safetensors.index.json: not a safetensors index"):
        read_shape(directory)


# (arch, tp, pp, kv cache dtype) -> vLLM's KV bytes per token per GPU (full-attention layers,
# sliding-window layers, window)
KV_CASES = [
    (LLAMA_31_8B, 1, 1, "auto", 32 * full_attention_page(8, 128, 2) // BLOCK, 0, None),          # 131,072
    (LLAMA_31_8B, 1, 1, "fp8", 32 * full_attention_page(8, 128, 1) // BLOCK, 0, None),           # halved
    (LLAMA_31_70B, 8, 2, "auto", 40 * full_attention_page(1, 128, 2) // BLOCK, 0, None),          # 40 layers a stage
    (LLAMA_31_70B, 16, 1, "auto", 80 * full_attention_page(1, 128, 2) // BLOCK, 0, None),         # a KV head replicated
    (QWEN3_8B, 2, 1, "auto", 36 * full_attention_page(4, 128, 2) // BLOCK, 0, None),
    (QWEN3_30B_A3B, 1, 1, "auto", 48 * full_attention_page(4, 128, 2) // BLOCK, 0, None),        # 98,304
    (MIXTRAL_8X7B, 2, 1, "auto", 32 * full_attention_page(4, 128, 2) // BLOCK, 0, None),
    (GEMMA2_9B, 1, 1, "auto", 21 * full_attention_page(8, 256, 2) // BLOCK,
     21 * full_attention_page(8, 256, 2) // BLOCK, 4096),
    (GPT_OSS_20B, 1, 1, "auto", 12 * full_attention_page(8, 64, 2) // BLOCK,
     12 * full_attention_page(8, 64, 2) // BLOCK, 128),
    (GPT_OSS_20B, 2, 1, "fp8", 12 * full_attention_page(4, 64, 1) // BLOCK,
     12 * full_attention_page(4, 64, 1) // BLOCK, 128),
    (DEEPSEEK_V2_LITE, 1, 1, "auto", 27 * mla_page(512 + 64, 2) // BLOCK, 0, None),              # 31,104
    (DEEPSEEK_V2_LITE, 4, 1, "auto", 27 * mla_page(512 + 64, 2) // BLOCK, 0, None),              # not split by tp
    (DEEPSEEK_V2_LITE, 1, 4, "fp8", 7 * mla_page(512 + 64, 1) // BLOCK, 0, None),                # stages 7,7,7,6
    (DEEPSEEK_V2_LITE, 1, 1, "fp8_ds_mla", 27 * 656, 0, None),                 # BLOCK x 656 a page
]


@pytest.mark.parametrize(("arch", "tp", "pp", "dtype", "full", "windowed", "window"), KV_CASES,
                         ids=lambda v: v.repo.split("/")[1] if isinstance(v, Arch) else str(v))
def test_kv_bytes_per_token_are_vllms(arch: Arch, tp: int, pp: int, dtype: str, full: int, windowed: int,
                                      window: int | None, checkpoints: dict[str, Path]):
    est = estimate(read_shape(checkpoints[arch.repo]), "vllm", tp, pp, dtype)
    assert (est.kv_per_token, est.kv_window_per_token, est.window) == (full, windowed, window)


def test_pipeline_stages_are_vllms():
    # get_pp_indices: the remainder of layers // pp, one each, to the stages before the last
    assert [len(r) for r in pp_layers(27, 4)] == [7, 7, 7, 6]
    assert [len(r) for r in pp_layers(5, 4)] == [1, 1, 2, 1]
    assert [len(r) for r in pp_layers(80, 2)] == [40, 40]


def test_a_window_caps_its_layers_kv(checkpoints: dict[str, Path]):
    # Gemma2Config: layer i slides when (i + 1) % 2; gpt-oss: its config's layer_types
    assert read_shape(checkpoints[GEMMA2_9B.repo]).layer_windows[:3] == (4096, None, 4096)
    assert read_shape(checkpoints[GPT_OSS_20B.repo]).layer_windows[-2:] == (128, None)
    est = estimate(read_shape(checkpoints[GEMMA2_9B.repo]), "vllm")
    per = 21 * 8 * 512 * 2             # each half of the layers, per token
    assert est.kv_bytes(1000) == 2 * per * 1000
    assert est.kv_bytes(8192) == per * 8192 + per * 4096
    overhead = ENGINES["vllm"].memory_overhead[0]
    gpu = GEMMA2_9B.total_size + overhead + est.kv_bytes(6000)
    assert est.context(gpu) == 6000                           # past the window, only full layers grow
    assert est.context(GEMMA2_9B.total_size + overhead + est.kv_bytes(100)) == 100
    assert est.needed == GEMMA2_9B.total_size + overhead + est.kv_bytes(4096)


def test_experts_are_all_resident(checkpoints: dict[str, Path]):
    # every expert's weights are on the GPUs, not the 8 of 128 a token uses: 61 GB, split over tp
    est = estimate(read_shape(checkpoints[QWEN3_30B_A3B.repo]), "vllm", tp=4)
    assert est.weights == QWEN3_30B_A3B.total_size // 4
    assert read_shape(checkpoints[QWEN3_30B_A3B.repo]).experts == 128


def test_kv_cache_dtype_comes_from_the_profiles_args():
    assert kv_cache_dtype(["--max-model-len", "8192", "--kv-cache-dtype", "fp8"]) == "fp8"
    assert kv_cache_dtype(["--kv-cache-dtype=fp8_e5m2"]) == "fp8_e5m2"
    assert kv_cache_dtype([]) == "auto"


def test_gguf_weights_are_llama_servers_model_size(tmp_path: Path):
    path = write_mistral_q4_k_m(tmp_path / "Mistral-7B-Instruct-v0.3-Q4_K_M.gguf")
    shape = read_shape(path)
    assert shape.weight_bytes == MISTRAL_Q4_K_M_SIZE
    from gguf import GGUFReader
    assert sum(int(t.n_elements) for t in GGUFReader(path).tensors) == MISTRAL_Q4_K_M_PARAMS
    # llama.cpp's f16 KV: every layer's K and V, 8 KV heads of 128
    assert (shape.layers, shape.kv_heads, shape.head_dim, shape.max_context) == (32, 8, 128, 32768)
    assert estimate(shape, "llamacpp").kv_per_token == 2 * 32 * 8 * 128 * 2
    assert read_shape(tmp_path) == shape               # a directory holding the file

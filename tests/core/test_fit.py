"""Will it fit: a model's GPU memory from its own files (llmgw/fit.py)."""
from __future__ import annotations

import struct
from pathlib import Path

import pytest

from llmgw.engines import ENGINES
from llmgw.fit import MIN_CONTEXT, ShapeError, estimate, estimate_dir, read_shape
from tests.fixtures.tiny_safetensors import tiny_llama

# hidden 256, 4 layers, vocab 4096: embed bf16 + lm_head f32 + per layer q, k, v (bf16), down (fp8), norm (f32)
TENSOR_BYTES = 4096 * 256 * 2 + 4096 * 256 * 4 + 4 * (256 * 256 * 2 + 2 * 64 * 256 * 2 + 256 * 1024 + 256 * 4)


def test_weight_bytes_are_the_tensors_bytes_exactly(tmp_path: Path):
    tiny_llama(tmp_path, window=512)
    shape = read_shape(tmp_path)
    assert shape.weight_bytes == TENSOR_BYTES == 8_130_560
    # and what the files hold past their headers, byte for byte
    on_disk = 0
    for f in tmp_path.glob("*.safetensors"):
        (length,) = struct.unpack("<Q", f.read_bytes()[:8])
        on_disk += f.stat().st_size - 8 - length
    assert shape.weight_bytes == on_disk
    assert (shape.layers, shape.kv_heads, shape.head_dim, shape.kv_dtype_bytes) == (4, 2, 32, 2)
    assert (shape.max_context, shape.sliding_window) == (8192, 512)
    # a window on every layer (Mistral v0.1's kind): a sequence's KV stops growing at the window
    est = estimate(shape, "vllm")
    assert (est.kv_per_token, est.kv_window_per_token, est.window) == (0, 1024, 512)
    overhead = ENGINES["vllm"].memory_overhead[0]
    assert est.context(TENSOR_BYTES + overhead + 1024 * 100) == 100
    assert est.context(TENSOR_BYTES + overhead + 1024 * 512) == 8192       # the whole context fits


def test_kv_per_token_follows_vllm_kv_heads_per_rank(tmp_path: Path):
    tiny_llama(tmp_path)
    shape = read_shape(tmp_path)
    # 2 (K and V) x layers of the stage x KV heads of the rank (vLLM get_num_kv_heads: max(1, kv // tp)) x 32 x 2 B
    assert estimate(shape, "vllm").kv_per_token == 2 * 4 * 2 * 32 * 2
    assert estimate(shape, "vllm", tp=2).kv_per_token == 2 * 4 * 1 * 32 * 2
    assert estimate(shape, "vllm", tp=4).kv_per_token == 2 * 4 * 1 * 32 * 2    # a KV head replicated
    assert estimate(shape, "vllm", pp=2).kv_per_token == 2 * 2 * 2 * 32 * 2
    est = estimate(shape, "vllm", tp=2, pp=2)
    assert est.weights == TENSOR_BYTES // 4
    overhead = ENGINES["vllm"].memory_overhead[0]
    assert est.needed == TENSOR_BYTES // 4 + overhead + 256 * MIN_CONTEXT
    assert est.context(overhead + TENSOR_BYTES // 4 + 256 * 1000) == 1000
    assert est.context(1) == 0


def test_each_engine_splits_as_its_renderer_does(tmp_path: Path):
    tiny_llama(tmp_path)
    vllm, sglang = estimate_dir(str(tmp_path), "vllm", 4, 2), estimate_dir(str(tmp_path), "sglang", 4, 2)
    assert (vllm.tp, vllm.pp, sglang.tp, sglang.pp) == (4, 2, 8, 1)
    llama = estimate_dir(str(tmp_path), "llamacpp", 2, 1)
    assert (llama.tp, llama.pp, llama.overhead) == (1, 2, ENGINES["llamacpp"].memory_overhead[0])


def test_unreadable_files_say_which_and_why(tmp_path: Path):
    with pytest.raises(ShapeError, match="no \\*.safetensors files"):
        read_shape(tmp_path)
    tiny_llama(tmp_path)
    bad = tmp_path / "model-00001-of-00002.safetensors"
    bad.write_bytes(struct.pack("<Q", 5) + b"{nope")
    with pytest.raises(ShapeError, match="model-00001-of-00002.safetensors: header is not JSON"):
        read_shape(tmp_path)
    bad.write_bytes(b"\x01")
    with pytest.raises(ShapeError, match="shorter than a safetensors header"):
        read_shape(tmp_path)
    (tmp_path / "config.json").write_text('{"hidden_size": 8}')
    with pytest.raises(ShapeError, match="config.json: no usable 'num_hidden_layers'"):
        read_shape(tmp_path)

"""Will it fit: a model's GPU memory per shard, from its own files (issue 48, first part).

Read, never loaded: of each `*.safetensors` file only its 8-byte little-endian header length and
the JSON header after it (each tensor's dtype, shape and byte offsets), and `config.json`. From
those, for a replica's tensor and pipeline parallel sizes (tp, pp):

- weights per GPU: the exact bytes of every tensor (its `data_offsets` span, so packed and
  quantized dtypes count what they store), split evenly over tp x pp GPUs, rounded up. The even
  split is an estimate: an engine replicates small tensors (norms) on every tensor-parallel rank;
- KV bytes per token per GPU: K and V for each layer of the GPU's pipeline stage and each KV head
  of its tensor-parallel rank: 2 x ceil(layers / pp) x max(1, kv_heads // tp) x head_dim x the
  dtype's bytes, as vLLM's ModelConfig.get_num_kv_heads and its attention spec count them. Every
  layer is counted as full attention: a sliding window (recorded) only lowers the real figure;
- the engine's overhead: its Engine's memory_overhead (llmgw/engines/), each figure with where it comes from;
- the context the rest of the GPU holds: (GPU memory - weights - overhead) // KV per token.

A replica needs per GPU: weights + overhead + the KV of MIN_CONTEXT tokens (or of the model's own
`max_position_embeddings` where that is shorter). Only a local directory is read (a path source
the controller-manager sees); hub and http(s) sources are not estimated yet, and such a replica
is placed by its GPU count alone, as before.
"""
from __future__ import annotations

import json
import math
import struct
from dataclasses import dataclass
from pathlib import Path

from llmgw.engines import ENGINES

GiB = 1 << 30
MiB = 1 << 20
# The context a replica must be able to hold at least, in tokens, for placement.
MIN_CONTEXT = 4096
# config.json's torch_dtype (or dtype) -> bytes per KV element.
DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2, "float8_e4m3fn": 1, "float8_e5m2": 1}


class ShapeError(ValueError):
    """The files cannot be read or do not say enough: no estimate, placement goes on as before."""


@dataclass(frozen=True)
class Shape:
    """What a model's files say about its size."""

    weight_bytes: int          # every tensor's bytes, all files
    layers: int
    kv_heads: int
    head_dim: int
    kv_dtype_bytes: int
    max_context: int | None    # config.json's max_position_embeddings
    sliding_window: int | None


@dataclass(frozen=True)
class Estimate:
    """One replica's GPU memory, per GPU, at tp x pp."""

    tp: int
    pp: int
    weights: int                 # bytes per GPU
    kv_per_token: int            # bytes per GPU
    overhead: int
    overhead_source: str
    min_context: int             # tokens placement asks room for

    @property
    def needed(self) -> int:
        """Bytes a GPU must have free: weights, overhead and the KV of min_context tokens."""
        return self.weights + self.overhead + self.kv_per_token * self.min_context

    def context(self, gpu_bytes: int) -> int:
        """Tokens of KV cache a GPU of `gpu_bytes` holds after weights and overhead (0 when none)."""
        return max(0, gpu_bytes - self.weights - self.overhead) // max(1, self.kv_per_token)

    def summary(self) -> str:
        return (f"needs {gib(self.needed)} per GPU at tp={self.tp} pp={self.pp}: weights {gib(self.weights)}, "
                f"overhead {gib(self.overhead)}, KV {self.kv_per_token} B/token x {self.min_context} tokens")


def gib(n: int) -> str:
    return f"{n / GiB:.1f} GiB"


def safetensors_bytes(path: Path) -> int:
    """The bytes of the tensors in one safetensors file, from its header alone."""
    try:
        with path.open("rb") as f:
            raw = f.read(8)
            if len(raw) != 8:
                raise ShapeError(f"{path}: shorter than a safetensors header")
            (length,) = struct.unpack("<Q", raw)
            if length > 100 * MiB:
                raise ShapeError(f"{path}: header of {length} bytes is not a safetensors header")
            header = json.loads(f.read(length))
    except OSError as err:
        raise ShapeError(f"{path}: {err.strerror or err}") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise ShapeError(f"{path}: header is not JSON: {err}") from None
    if not isinstance(header, dict):
        raise ShapeError(f"{path}: header is not a JSON object")
    total = 0
    for name, info in header.items():
        if name == "__metadata__":
            continue
        try:
            start, end = info["data_offsets"]
            total += int(end) - int(start)
        except (TypeError, KeyError, ValueError):
            raise ShapeError(f"{path}: tensor {name!r} has no data_offsets [start, end]") from None
    return total


def read_shape(directory: Path) -> Shape:
    """The Shape of the model in `directory` (its *.safetensors and config.json)."""
    files = sorted(directory.glob("*.safetensors"))
    if not files:
        raise ShapeError(f"{directory}: no *.safetensors files")
    try:
        config = json.loads((directory / "config.json").read_text())
    except OSError as err:
        raise ShapeError(f"{directory / 'config.json'}: {err.strerror or err}") from None
    except ValueError as err:
        raise ShapeError(f"{directory / 'config.json'}: not JSON: {err}") from None
    text = config.get("text_config")   # multimodal configs keep the language model's apart
    if isinstance(text, dict):
        config = {**config, **text}
    try:
        layers = int(config["num_hidden_layers"])
        heads = int(config["num_attention_heads"])
        kv_heads = int(config.get("num_key_value_heads") or heads)
        head_dim = int(config.get("head_dim") or int(config["hidden_size"]) // heads)
    except (KeyError, TypeError, ValueError) as err:
        raise ShapeError(f"{directory / 'config.json'}: no usable {err} (layers, heads, head size)") from None
    dtype = str(config.get("torch_dtype") or config.get("dtype") or "bfloat16")
    if dtype not in DTYPE_BYTES:
        raise ShapeError(f"{directory / 'config.json'}: unknown dtype {dtype!r}")
    window, context = config.get("sliding_window"), config.get("max_position_embeddings")
    return Shape(weight_bytes=sum(safetensors_bytes(f) for f in files), layers=layers, kv_heads=kv_heads,
                 head_dim=head_dim, kv_dtype_bytes=DTYPE_BYTES[dtype],
                 max_context=int(context) if isinstance(context, int) else None,
                 sliding_window=int(window) if isinstance(window, int) else None)


def estimate(shape: Shape, engine: str, tp: int = 1, pp: int = 1) -> Estimate:
    overhead, source = ENGINES[engine].memory_overhead
    kv = 2 * math.ceil(shape.layers / pp) * max(1, shape.kv_heads // tp) * shape.head_dim * shape.kv_dtype_bytes
    floor = min(MIN_CONTEXT, shape.max_context) if shape.max_context else MIN_CONTEXT
    return Estimate(tp=tp, pp=pp, weights=math.ceil(shape.weight_bytes / (tp * pp)), kv_per_token=kv,
                    overhead=overhead, overhead_source=source, min_context=floor)


def parallel(engine: str, gpus_per_node: int, nodes: int) -> tuple[int, int]:
    """(tp, pp) as the engine's renderer splits a replica (its Engine's split)."""
    split = ENGINES[engine].split
    if split == "tp":
        return gpus_per_node * nodes, 1
    if split == "layers":
        return 1, gpus_per_node
    return gpus_per_node, nodes


def estimate_dir(directory: str, engine: str, gpus_per_node: int, nodes: int) -> Estimate:
    """The Estimate for a replica of the model in a local `directory`; ShapeError when there is none."""
    tp, pp = parallel(engine, gpus_per_node, nodes)
    return estimate(read_shape(Path(directory)), engine, tp, pp)

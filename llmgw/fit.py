"""Will it fit: a model's GPU memory per shard, from its own files (issue 48).

Read, never loaded: of each `*.safetensors` file only its 8-byte little-endian header length and
the JSON header after it (each tensor's dtype, shape and byte offsets), and `config.json`; of a
GGUF file its metadata and tensor infos (the `gguf` package). A pulled source (hf://, http(s)://)
is read the same way before the pull, by HTTP Range reads (llmgw/fitremote.py). From those, for a
replica's tensor and pipeline parallel sizes (tp, pp):

- weights per GPU: the exact bytes of every tensor (its `data_offsets` span, so packed and
  quantized dtypes count what they store: FP8 and its scales, MXFP4's U8 blocks and scales, every
  expert), split evenly over tp x pp GPUs, rounded up. The even split is an estimate: an engine
  replicates small tensors (norms) on every tensor-parallel rank;
- KV bytes per token per GPU, per layer of the GPU's pipeline stage as vLLM's KV cache specs count
  them (vllm/v1/kv_cache_interface.py at 001cabc1be16a59a70d720ed61a13b678c060a18:
  FullAttentionSpec.real_page_size_bytes / block_size = num_kv_heads x (head_size + head_size_v) x
  dtype bytes, with num_kv_heads = max(1, kv_heads // tp) as ModelConfig.get_num_kv_heads says;
  MLAAttentionSpec: one latent of kv_lora_rank + qk_rope_head_dim per token, not split by tp;
  SlidingWindowSpec: the full formula, its tokens capped at the window). `--kv-cache-dtype` fp8
  stores one byte an element. The layers of a stage are vLLM's get_pp_indices' (the remainder of
  layers // pp goes to the stages before the last), and the stage with the most KV is the one counted;
- the engine's overhead: its Engine's memory_overhead (llmgw/engines/), each figure with where it comes from;
- the context the rest of the GPU holds, full-attention layers for every token and sliding-window
  layers for at most their window.

A replica needs per GPU: weights + overhead + the KV of MIN_CONTEXT tokens (or of the model's own
`max_position_embeddings` where that is shorter).
"""
from __future__ import annotations

import dataclasses
import json
import math
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from llmgw.engines import ENGINES

if TYPE_CHECKING:
    from llmgw.api import ModelSpec

GiB = 1 << 30
MiB = 1 << 20
# The context a replica must be able to hold at least, in tokens, for placement.
MIN_CONTEXT = 4096
# config.json's torch_dtype (or dtype) -> bytes per KV element. float32 is 2: vLLM's dtype "auto"
# runs a float32 checkpoint in 16 bits (ModelConfig's _get_and_verify_dtype).
DTYPE_BYTES = {"float32": 2, "float16": 2, "bfloat16": 2, "float8_e4m3fn": 1, "float8_e5m2": 1}
# --kv-cache-dtype (vLLM's CacheDType, SGLang's alike) -> bytes per element; "auto": the model's.
KV_CACHE_DTYPES = {"auto": 0, "bfloat16": 2, "float16": 2, "half": 2, "fp8": 1, "fp8_e4m3": 1, "fp8_e5m2": 1,
                   "fp8_inc": 1, "fp8_ds_mla": 1}
# MLAAttentionSpec.real_page_size_bytes under --kv-cache-dtype fp8_ds_mla: bytes per token per layer.
FP8_DS_MLA_BYTES = 656
MAX_HEADER = 100 * MiB
INDEX = "model.safetensors.index.json"


class ShapeError(ValueError):
    """The files cannot be read or do not say enough: no estimate, placement goes on as before."""


@dataclass(frozen=True)
class Shape:
    """What a model's files say about its size."""

    weight_bytes: int          # every tensor's bytes, all files
    layers: int
    kv_heads: int              # 1 for MLA (its one latent per token)
    head_dim: int              # MLA: kv_lora_rank + qk_rope_head_dim
    kv_dtype_bytes: int
    max_context: int | None    # config.json's max_position_embeddings
    sliding_window: int | None
    # Each layer's sliding window, None for full attention; () when every layer is full.
    layer_windows: tuple[int | None, ...] = ()
    mla: bool = False
    experts: int = 0           # routed experts per MoE layer (all resident: weight_bytes counts them)


@dataclass(frozen=True)
class Estimate:
    """One replica's GPU memory, per GPU, at tp x pp."""

    tp: int
    pp: int
    weights: int                 # bytes per GPU
    kv_per_token: int            # bytes per GPU, the full-attention layers'
    overhead: int
    overhead_source: str
    min_context: int             # tokens placement asks room for
    kv_window_per_token: int = 0     # bytes per GPU, the sliding-window layers', up to `window` tokens
    window: int | None = None
    max_context: int | None = None   # the model's own (max_position_embeddings)

    def kv_bytes(self, tokens: int) -> int:
        """The KV cache of one sequence of `tokens` tokens, per GPU."""
        held = tokens if self.window is None else min(tokens, self.window)
        return self.kv_per_token * tokens + self.kv_window_per_token * held

    @property
    def needed(self) -> int:
        """Bytes a GPU must have free: weights, overhead and the KV of min_context tokens."""
        return self.weights + self.overhead + self.kv_bytes(self.min_context)

    def context(self, gpu_bytes: int) -> int:
        """Tokens of KV cache a GPU of `gpu_bytes` holds after weights and overhead (0 when none)."""
        free = max(0, gpu_bytes - self.weights - self.overhead)
        both = self.kv_per_token + self.kv_window_per_token
        if self.window is None or free < both * self.window:
            return free // max(1, both)
        if self.kv_per_token == 0:           # every layer windowed: the model's whole context, in the window's KV
            return self.max_context or self.window
        return self.window + (free - both * self.window) // self.kv_per_token

    def kv_text(self) -> str:
        """The KV per token as a table shows it: `512 B`, or `512 B + 256 B x 4096` with windows."""
        text = f"{self.kv_per_token} B"
        return text if self.window is None else f"{text} + {self.kv_window_per_token} B x {self.window}"

    def summary(self) -> str:
        return (f"needs {gib(self.needed)} per GPU at tp={self.tp} pp={self.pp}: weights {gib(self.weights)}, "
                f"overhead {gib(self.overhead)}, KV {self.kv_text()}/token x {self.min_context} tokens")


def gib(n: int) -> str:
    return f"{n / GiB:.1f} GiB"


# ----------------------------------------------------------------------------- safetensors


def header_length(raw: bytes, where: str) -> int:
    """The JSON header's length from a safetensors file's first 8 bytes."""
    if len(raw) != 8:
        raise ShapeError(f"{where}: shorter than a safetensors header")
    (length,) = struct.unpack("<Q", raw)
    if length > MAX_HEADER:
        raise ShapeError(f"{where}: header of {length} bytes is not a safetensors header")
    return int(length)


def header_tensor_bytes(raw: bytes, where: str) -> int:
    """The bytes of the tensors a safetensors JSON header describes."""
    try:
        header = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise ShapeError(f"{where}: header is not JSON: {err}") from None
    if not isinstance(header, dict):
        raise ShapeError(f"{where}: header is not a JSON object")
    total = 0
    for name, info in header.items():
        if name == "__metadata__":
            continue
        try:
            start, end = info["data_offsets"]
            total += int(end) - int(start)
        except (TypeError, KeyError, ValueError):
            raise ShapeError(f"{where}: tensor {name!r} has no data_offsets [start, end]") from None
    return total


def safetensors_bytes(path: Path) -> int:
    """The bytes of the tensors in one safetensors file, from its header alone."""
    try:
        with path.open("rb") as f:
            length = header_length(f.read(8), str(path))
            return header_tensor_bytes(f.read(length), str(path))
    except OSError as err:
        raise ShapeError(f"{path}: {err.strerror or err}") from None


def indexed(names: list[str], index: bytes | None, where: str) -> list[str]:
    """The safetensors files an engine loads: where the checkpoint has a model.safetensors.index.json,
    only those its weight_map names (vLLM's filter_duplicate_safetensors_files: a repository may hold
    its weights twice, as Mistral's do, consolidated.safetensors beside the shards)."""
    if index is None:
        return names
    try:
        named = set(json.loads(index)["weight_map"].values())
    except (ValueError, KeyError, TypeError, AttributeError):
        raise ShapeError(f"{where}: not a safetensors index (no weight_map)") from None
    return [n for n in names if n.rsplit("/", 1)[-1] in named]


# ------------------------------------------------------------------------------ config.json


def parse_config(raw: bytes, where: str) -> dict[str, Any]:
    try:
        config = json.loads(raw)
    except ValueError as err:
        raise ShapeError(f"{where}: not JSON: {err}") from None
    if not isinstance(config, dict):
        raise ShapeError(f"{where}: not a JSON object")
    text = config.get("text_config")   # multimodal configs keep the language model's apart
    return {**config, **text} if isinstance(text, dict) else config


def shape_of(config: dict[str, Any], weight_bytes: int, where: str) -> Shape:
    """The Shape of a model from its config.json (already parsed) and its tensors' bytes."""
    try:
        layers = int(config["num_hidden_layers"])
        heads = int(config["num_attention_heads"])
        kv_heads = int(config.get("num_key_value_heads") or heads)
        head_dim = int(config.get("head_dim") or int(config["hidden_size"]) // heads)
        mla = config.get("kv_lora_rank") is not None
        if mla:   # vLLM's ModelConfig.get_head_size and get_total_num_kv_heads for MLA
            kv_heads, head_dim = 1, int(config["kv_lora_rank"]) + int(config["qk_rope_head_dim"])
    except (KeyError, TypeError, ValueError) as err:
        raise ShapeError(f"{where}: no usable {err} (layers, heads, head size)") from None
    dtype = str(config.get("torch_dtype") or config.get("dtype") or "bfloat16")
    if dtype not in DTYPE_BYTES:
        raise ShapeError(f"{where}: unknown dtype {dtype!r}")
    window, context = config.get("sliding_window"), config.get("max_position_embeddings")
    window = window if isinstance(window, int) and config.get("use_sliding_window", True) else None
    experts = config.get("num_local_experts") or config.get("num_experts") or config.get("n_routed_experts")
    return Shape(weight_bytes=weight_bytes, layers=layers, kv_heads=kv_heads, head_dim=head_dim,
                 kv_dtype_bytes=DTYPE_BYTES[dtype], max_context=context if isinstance(context, int) else None,
                 sliding_window=window, layer_windows=layer_windows(config, layers, window), mla=mla,
                 experts=experts if isinstance(experts, int) else 0)


def layer_windows(config: dict[str, Any], layers: int, window: int | None) -> tuple[int | None, ...]:
    """Each layer's sliding window as HF's configs say: `layer_types` where given; else Gemma 2's
    and 3's interleaving (every `sliding_window_pattern`-th layer full; Gemma 2: every second);
    else a window on every layer (Mistral v0.1) or on none."""
    if window is None:
        return ()
    types = config.get("layer_types")
    if isinstance(types, list) and len(types) == layers:
        return tuple(window if t == "sliding_attention" else None for t in types)
    pattern = config.get("sliding_window_pattern") or (2 if config.get("model_type") == "gemma2" else None)
    if isinstance(pattern, int) and pattern > 0:
        return tuple(None if (i + 1) % pattern == 0 else window for i in range(layers))
    return (window,) * layers


# ------------------------------------------------------------------------------------ GGUF


def gguf_shape(path: Path, readable: int | None = None) -> Shape:
    """The Shape of a GGUF file: its tensors' bytes from their infos, the attention from its metadata,
    the KV as llama.cpp allocates it (f16 K and V for every layer's KV heads). With `readable`, only
    the file's first so many bytes are known (a Range read): IncompleteGGUF when the metadata and
    tensor infos run past them."""
    from gguf import GGUFReader

    try:
        reader = GGUFReader(path)
    except (OSError, ValueError, KeyError, IndexError, OverflowError) as err:
        if readable is not None:
            raise IncompleteGGUF(str(path)) from None
        raise ShapeError(f"{path}: not a readable GGUF file: {err}") from None
    if readable is not None and reader.data_offset > readable:
        raise IncompleteGGUF(str(path))

    def value(key: str) -> Any:
        field = reader.get_field(key)
        return None if field is None else field.contents()

    arch = value("general.architecture")
    heads, kv_heads = value(f"{arch}.attention.head_count"), value(f"{arch}.attention.head_count_kv")
    layers, width = value(f"{arch}.block_count"), value(f"{arch}.embedding_length")
    if not isinstance(layers, int) or not isinstance(heads, int) or not isinstance(width, int):
        raise ShapeError(f"{path}: no {arch}.block_count, attention.head_count or embedding_length")
    kv_heads = max(kv_heads) if isinstance(kv_heads, list) else kv_heads or heads
    window, context = value(f"{arch}.attention.sliding_window"), value(f"{arch}.context_length")
    return Shape(weight_bytes=sum(int(t.n_bytes) for t in reader.tensors), layers=layers, kv_heads=kv_heads,
                 head_dim=value(f"{arch}.attention.key_length") or width // heads, kv_dtype_bytes=2,
                 max_context=context if isinstance(context, int) else None,
                 sliding_window=window if isinstance(window, int) else None)


class IncompleteGGUF(ShapeError):
    """A GGUF file's first bytes do not hold all its metadata and tensor infos: read more."""


# ----------------------------------------------------------------------------- a directory


def read_shape(directory: Path) -> Shape:
    """The Shape of the model in `directory` (its *.safetensors and config.json), or of a GGUF
    file (`directory` the file, or a directory holding one)."""
    ggufs = [directory] if directory.suffix == ".gguf" else sorted(directory.glob("*.gguf"))
    files = sorted(directory.glob("*.safetensors")) if directory.is_dir() else []
    index = directory / INDEX
    try:
        files = [Path(n) for n in indexed([str(f) for f in files], index.read_bytes() if index.is_file() else None,
                                          str(index))]
    except OSError as err:
        raise ShapeError(f"{index}: {err.strerror or err}") from None
    if not files and ggufs:
        return gguf_shape(ggufs[0])
    if not files:
        raise ShapeError(f"{directory}: no *.safetensors files")
    where = str(directory / "config.json")
    try:
        raw = (directory / "config.json").read_bytes()
    except OSError as err:
        raise ShapeError(f"{where}: {err.strerror or err}") from None
    shape = shape_of(parse_config(raw, where), 0, where)     # a config that says too little, before the shards
    return dataclasses.replace(shape, weight_bytes=sum(safetensors_bytes(f) for f in files))


# ---------------------------------------------------------------------------- the estimate


def pp_layers(layers: int, pp: int) -> list[range]:
    """Each pipeline stage's layers, as vLLM's get_pp_indices splits them (vllm/distributed/utils.py):
    layers // pp each, the remainder one more each to the stages before the last."""
    counts = [layers // pp] * pp
    for i in range(2, layers % pp + 2):
        counts[-i] += 1
    starts = [sum(counts[:k]) for k in range(pp)]
    return [range(s, s + c) for s, c in zip(starts, counts, strict=True)]


def estimate(shape: Shape, engine: str, tp: int = 1, pp: int = 1, kv_cache_dtype: str = "auto") -> Estimate:
    """One replica's Estimate at tp x pp; `kv_cache_dtype` as the engine's --kv-cache-dtype."""
    if kv_cache_dtype not in KV_CACHE_DTYPES:
        raise ShapeError(f"--kv-cache-dtype {kv_cache_dtype!r} is not one of {', '.join(KV_CACHE_DTYPES)}")
    dtype = KV_CACHE_DTYPES[kv_cache_dtype] or shape.kv_dtype_bytes
    if shape.mla:    # MLAAttentionSpec: one latent per token, the same on every tensor-parallel rank
        per_layer = FP8_DS_MLA_BYTES if kv_cache_dtype == "fp8_ds_mla" else shape.head_dim * dtype
    else:            # FullAttentionSpec / SlidingWindowSpec: K and V of this rank's KV heads
        per_layer = 2 * max(1, shape.kv_heads // tp) * shape.head_dim * dtype
    windows = shape.layer_windows or (None,) * shape.layers
    stages = [[windows[i] for i in stage] for stage in pp_layers(shape.layers, pp)]
    worst = max(stages, key=lambda s: (len(s), sum(w is None for w in s)))
    full = sum(w is None for w in worst)
    window = max((w for w in worst if w is not None), default=None)
    overhead, source = ENGINES[engine].memory_overhead
    floor = min(MIN_CONTEXT, shape.max_context) if shape.max_context else MIN_CONTEXT
    return Estimate(tp=tp, pp=pp, weights=math.ceil(shape.weight_bytes / (tp * pp)), kv_per_token=full * per_layer,
                    overhead=overhead, overhead_source=source, min_context=floor,
                    kv_window_per_token=(len(worst) - full) * per_layer, window=window,
                    max_context=shape.max_context)


def parallel(engine: str, gpus_per_node: int, nodes: int) -> tuple[int, int]:
    """(tp, pp) as the engine's renderer splits a replica (its Engine's split)."""
    split = ENGINES[engine].split
    if split == "tp":
        return gpus_per_node * nodes, 1
    if split == "layers":
        return 1, gpus_per_node
    return gpus_per_node, nodes


def kv_cache_dtype(args: list[str]) -> str:
    """The --kv-cache-dtype a profile's args set (vLLM's and SGLang's flag), else "auto"."""
    for i, arg in enumerate(args):
        if arg.startswith("--kv-cache-dtype="):
            return arg.split("=", 1)[1]
        if arg == "--kv-cache-dtype" and i + 1 < len(args):
            return args[i + 1]
    return "auto"


def profile_estimate(shape: Shape, spec: ModelSpec, index: int, tp: int | None = None) -> Estimate:
    """Profile `index` of a Model at its engine's split (or at tensor parallel `tp`, its pipeline
    stages kept) and --kv-cache-dtype, asking room for the context floor the spec sets
    (ModelSpec.context_floor: minContext, or its engine's --max-model-len)."""
    p = spec.profiles[index]
    split_tp, pp = parallel(p.engine, p.gpusPerNode, p.nodes)
    est = estimate(shape, p.engine, tp or split_tp, pp, kv_cache_dtype(p.args))
    floor = spec.context_floor(index)
    return est if floor is None else dataclasses.replace(est, min_context=floor)


def estimate_dir(directory: str, engine: str, gpus_per_node: int, nodes: int,
                 kv_cache_dtype: str = "auto") -> Estimate:
    """The Estimate for a replica of the model in a local `directory`; ShapeError when there is none."""
    tp, pp = parallel(engine, gpus_per_node, nodes)
    return estimate(read_shape(Path(directory)), engine, tp, pp, kv_cache_dtype)

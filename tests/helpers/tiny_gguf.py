"""A tiny random-weight llama-architecture GGUF for a real llama-server: 2 layers, width 64.

The vocabulary (and tokenizer) comes from llama.cpp's own llama SPM vocabulary
file, which hack/llama-server.sh keeps next to the binary; a ChatML template
lets /v1/chat/completions format messages. The model talks nonsense, quickly.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
from gguf import GGUFReader, GGUFValueType, GGUFWriter

WIDTH, LAYERS, FF, HEADS = 64, 2, 128, 4
CHATML = ("{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] "
          "+ '<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}"
          "{% endif %}")


def _field(reader: GGUFReader, key: str):
    f = reader.fields[key]
    if f.types[0] == GGUFValueType.ARRAY:
        if f.types[1] == GGUFValueType.STRING:
            return [bytes(f.parts[i]).decode("utf-8") for i in f.data]
        return [f.parts[i][0].item() for i in f.data]
    if f.types[0] == GGUFValueType.STRING:
        return bytes(f.parts[f.data[0]]).decode("utf-8")
    return f.parts[f.data[0]][0].item()


def make(path: Path, vocab: Path, context: int = 2048, seed: int = 0) -> Path:
    """Write the model to `path` and return it."""
    src = GGUFReader(str(vocab))
    tokens = _field(src, "tokenizer.ggml.tokens")
    rng = np.random.default_rng(seed)

    def weights(*shape: int, dtype=np.float32) -> np.ndarray:
        return (rng.standard_normal(shape) * 0.02).astype(dtype)

    w = GGUFWriter(str(path), "llama")
    w.add_name("llmgw-tiny")
    w.add_context_length(context)
    w.add_embedding_length(WIDTH)
    w.add_block_count(LAYERS)
    w.add_feed_forward_length(FF)
    w.add_head_count(HEADS)
    w.add_head_count_kv(HEADS)
    w.add_rope_dimension_count(WIDTH // HEADS)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_vocab_size(len(tokens))
    w.add_file_type(1)  # mostly F16
    w.add_tokenizer_model(_field(src, "tokenizer.ggml.model"))
    w.add_tokenizer_pre(_field(src, "tokenizer.ggml.pre"))
    w.add_token_list(tokens)
    w.add_token_scores(_field(src, "tokenizer.ggml.scores"))
    w.add_token_types(_field(src, "tokenizer.ggml.token_type"))
    w.add_bos_token_id(_field(src, "tokenizer.ggml.bos_token_id"))
    w.add_eos_token_id(_field(src, "tokenizer.ggml.eos_token_id"))
    w.add_unk_token_id(_field(src, "tokenizer.ggml.unknown_token_id"))
    w.add_add_bos_token(True)
    w.add_add_eos_token(False)
    w.add_chat_template(CHATML)

    w.add_tensor("token_embd.weight", weights(len(tokens), WIDTH, dtype=np.float16))
    w.add_tensor("output_norm.weight", np.ones(WIDTH, dtype=np.float32))
    w.add_tensor("output.weight", weights(len(tokens), WIDTH, dtype=np.float16))
    for i in range(LAYERS):
        b = f"blk.{i}."
        w.add_tensor(b + "attn_norm.weight", np.ones(WIDTH, dtype=np.float32))
        for name in ("attn_q", "attn_k", "attn_v", "attn_output"):
            w.add_tensor(b + name + ".weight", weights(WIDTH, WIDTH))
        w.add_tensor(b + "ffn_norm.weight", np.ones(WIDTH, dtype=np.float32))
        w.add_tensor(b + "ffn_gate.weight", weights(FF, WIDTH))
        w.add_tensor(b + "ffn_up.weight", weights(FF, WIDTH))
        w.add_tensor(b + "ffn_down.weight", weights(WIDTH, FF))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path

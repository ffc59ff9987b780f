"""The sim engine's command line: parsed with argparse so it reads like a real engine's help."""
from __future__ import annotations

import argparse
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from llmgw.kvevents.publisher import KVEventsConfig, parse_config
from llmgw.routing.chattemplate import load_chat_template
from llmgw.routing.kvblocks import load_tokenizer


@dataclass(frozen=True)
class SimConfig:
    host: str
    port: int
    served_model_names: list[str]
    rank: int = 0
    world_size: int = 1
    head_host: str = ""
    dist_port: int = 0
    load_seconds: float = 0.0
    tokens_per_second: float = 0.0
    ttft_ms: float = 0.0
    drain_grace: float = 30.0
    fail_after: float | None = None
    crash_on_request: int | None = None
    prefill_ms_per_token: float = 0.0
    decode_ms_per_token: float = 0.0
    max_num_seqs: int = 256
    block_size: int = 16
    kv_cache_tokens: int = 262144
    model_path: str | None = None
    enable_lora: bool = False
    max_loras: int = 1
    lora_load_seconds: float = 0.0
    kv_events: KVEventsConfig = KVEventsConfig()
    api: str = "vllm"  # the engine whose LoRA API and KV events the sim plays: vllm or sglang

    @property
    def model(self) -> str:
        return self.served_model_names[0]


def split_host_port(text: str) -> tuple[str, int]:
    """'HOST:PORT' or '[V6]:PORT' -> (host, port); ValueError says what is wrong."""
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"{text!r} is not HOST:PORT")
    return host.strip("[]"), int(port)


N = TypeVar("N", int, float)


def _nonnegative(kind: Callable[[str], N]) -> Callable[[str], N]:
    def parse(text: str) -> N:
        value = kind(text)
        if value < 0:
            raise argparse.ArgumentTypeError(f"{text} is negative")
        return value
    parse.__name__ = getattr(kind, "__name__", "number")
    return parse


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="llmgw sim",
        description="Simulated LLM engine: a real rendezvous between ranks, an OpenAI-compatible API "
                    "on rank 0 with fake tokens.",
    )
    p.add_argument("--host", required=True, help="address to bind (rank 0 serves HTTP on it)")
    p.add_argument("--port", type=int, required=True, help="HTTP serve port (rank 0)")
    p.add_argument("--served-model-name", nargs="+", action="extend", required=True, metavar="NAME",
                   help="model names the API answers to; the first is the model's name")
    p.add_argument("--model", metavar="PATH",
                   help="the model's weights on this node (a directory or a file); the sim reads none, "
                        "but refuses to start where the path is missing, as an engine would; a "
                        "tokenizer.json in the directory tokenizes prompts (else a word is a token), its chat "
                        "template (chat_template.jinja or tokenizer_config.json's) renders chats")
    p.add_argument("--rank", type=_nonnegative(int), default=0, help="this process's rank (default: 0)")
    p.add_argument("--world-size", type=int, default=1, help="number of ranks (default: 1)")
    p.add_argument("--dist-init-addr", metavar="HEAD:PORT",
                   help="rank 0's rendezvous address; rank 0 binds PORT (needed when --world-size > 1)")
    p.add_argument("--load-seconds", type=_nonnegative(float), default=0.0,
                   help="time /health answers 503 'loading' after all ranks joined (default: 0)")
    p.add_argument("--tokens-per-second", type=_nonnegative(float), default=0.0,
                   help="generation rate per request; 0 = no delay (default: 0)")
    p.add_argument("--ttft-ms", type=_nonnegative(float), default=0.0,
                   help="time to first token in milliseconds (default: 0)")
    p.add_argument("--drain-grace", type=_nonnegative(float), default=30.0,
                   help="on SIGTERM, seconds in-flight requests get to finish (default: 30)")
    p.add_argument("--fail-after", type=_nonnegative(float), metavar="SECONDS",
                   help="injected failure: exit with status 3 this many seconds after start")
    p.add_argument("--crash-on-request", type=int, metavar="N",
                   help="injected failure: exit with status 3 on receiving the N-th generation request")
    p.add_argument("--api", choices=("vllm", "sglang"), default="vllm",
                   help="the engine whose runtime LoRA API and KV events the sim plays: vllm, or sglang "
                        "(SGLang 0.5.23's /load_lora_adapter and /unload_lora_adapter, an adapter requested as "
                        "BASE:ADAPTER, --kv-events-config as SGLang's KVEventsConfig, and its events: its page "
                        "hashes and its layout) (default: vllm)")
    model = p.add_argument_group(
        "step model", "a scheduler and prefix cache like vLLM's: a prompt's tokens are its words; "
        "requests wait for one of --max-num-seqs running slots; each step prefills the uncached "
        "prompt tokens of the requests it admits and decodes one token of every running request, "
        "and lasts --prefill-ms-per-token per prefilled token plus --decode-ms-per-token per "
        "decoding request. Either cost > 0 turns it on (instead of --ttft-ms/--tokens-per-second); "
        "the prefix cache is used either way")
    model.add_argument("--prefill-ms-per-token", type=_nonnegative(float), default=0.0, metavar="MS",
                       help="step time per uncached prompt token, in ms (default: 0)")
    model.add_argument("--decode-ms-per-token", type=_nonnegative(float), default=0.0, metavar="MS",
                       help="step time per running request, in ms: each gets one token per step (default: 0)")
    model.add_argument("--max-num-seqs", type=_positive, default=256, metavar="N",
                       help="requests running at once; the rest wait (default: 256)")
    model.add_argument("--block-size", type=_positive, default=16, metavar="N",
                       help="tokens per prefix-cache block (default: 16)")
    model.add_argument("--kv-cache-tokens", type=_nonnegative(int), default=262144, metavar="N",
                       help="prefix-cache capacity in tokens, least recently used blocks evicted "
                            "first; 0 = no prefix caching (default: 262144)")
    model.add_argument("--kv-events-config", metavar="JSON",
                       help="publish the prefix cache's KV events as vLLM does (its KVEventsConfig as "
                            "JSON: enable_kv_cache_events, publisher, endpoint, replay_endpoint, "
                            "buffer_steps, hwm, max_queue_size, topic); block hashes are seeded with "
                            "PYTHONHASHSEED as vLLM's sha256_cbor (default: no events)")
    lora = p.add_argument_group(
        "LoRA", "vLLM's runtime LoRA API: POST /v1/load_lora_adapter {lora_name, lora_path} and "
        "/v1/unload_lora_adapter {lora_name}, with vLLM's answers and errors; a loaded adapter is listed "
        "by /v1/models (parent: the model) and answers requests under its name. The sim reads no "
        "adapter weights, but refuses a lora_path that is not there, as vLLM does, and a load past "
        "--max-loras, which vLLM would take into its CPU cache")
    lora.add_argument("--enable-lora", action="store_true", help="serve the runtime LoRA API (default: off)")
    lora.add_argument("--max-loras", type=_positive, default=1, metavar="N",
                      help="LoRA adapters loaded at once (default: 1)")
    lora.add_argument("--lora-load-seconds", type=_nonnegative(float), default=0.0, metavar="SECONDS",
                      help="how long a load takes before it is answered (default: 0)")
    return p


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text} is not a positive integer")
    return value


def parse(argv: list[str]) -> SimConfig:
    p = parser()
    a = p.parse_args(argv)
    if a.world_size < 1:
        p.error(f"--world-size must be at least 1, not {a.world_size}")
    if a.rank >= a.world_size:
        p.error(f"--rank {a.rank} is not below --world-size {a.world_size}")
    if a.crash_on_request is not None and a.crash_on_request < 1:
        p.error(f"--crash-on-request counts from 1, not {a.crash_on_request}")
    if not 0 <= a.port < 65536:
        p.error(f"--port {a.port} is not a TCP port")
    if (a.prefill_ms_per_token or a.decode_ms_per_token) and (a.ttft_ms or a.tokens_per_second):
        p.error("--ttft-ms and --tokens-per-second pace requests one by one; they do not go with "
                "the step model (--prefill-ms-per-token, --decode-ms-per-token)")
    if a.model is not None and not os.path.exists(a.model):
        p.error(f"--model {a.model}: no such file or directory: the weights are not on this node")
    try:
        load_tokenizer(a.model)
        load_chat_template(a.model)
    except ValueError as e:
        p.error(f"--model: {e}")
    kv_events = KVEventsConfig()
    if a.kv_events_config is not None:
        try:
            kv_events = parse_config(a.kv_events_config, sglang=a.api == "sglang")
        except (ValueError, TypeError) as e:
            p.error(f"--kv-events-config: {e}")
    head_host, dist_port = "", 0
    if a.world_size > 1:
        if not a.dist_init_addr:
            p.error("--dist-init-addr HEAD:PORT is required when --world-size > 1")
        try:
            head_host, dist_port = split_host_port(a.dist_init_addr)
        except ValueError as e:
            p.error(f"--dist-init-addr: {e}")
    return SimConfig(
        host=a.host, port=a.port, served_model_names=list(dict.fromkeys(a.served_model_name)),
        rank=a.rank, world_size=a.world_size, head_host=head_host, dist_port=dist_port,
        load_seconds=a.load_seconds, tokens_per_second=a.tokens_per_second, ttft_ms=a.ttft_ms,
        drain_grace=a.drain_grace, fail_after=a.fail_after, crash_on_request=a.crash_on_request,
        prefill_ms_per_token=a.prefill_ms_per_token, decode_ms_per_token=a.decode_ms_per_token,
        max_num_seqs=a.max_num_seqs, block_size=a.block_size, kv_cache_tokens=a.kv_cache_tokens,
        model_path=a.model, kv_events=kv_events, enable_lora=a.enable_lora, max_loras=a.max_loras,
        lora_load_seconds=a.lora_load_seconds, api=a.api,
    )

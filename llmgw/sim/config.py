"""The sim engine's command line: parsed with argparse so it reads like a real engine's help."""
from __future__ import annotations

import argparse
from dataclasses import dataclass


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

    @property
    def model(self) -> str:
        return self.served_model_names[0]


def split_host_port(text: str) -> tuple[str, int]:
    """'HOST:PORT' or '[V6]:PORT' -> (host, port); ValueError says what is wrong."""
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"{text!r} is not HOST:PORT")
    return host.strip("[]"), int(port)


def _nonnegative(kind):
    def parse(text: str):
        value = kind(text)
        if value < 0:
            raise argparse.ArgumentTypeError(f"{text} is negative")
        return value
    parse.__name__ = kind.__name__
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
    return p


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
    )

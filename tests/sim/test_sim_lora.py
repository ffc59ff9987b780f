"""The sim's runtime LoRA API, as vLLM's: load, unload, its errors, requests under an adapter's name,
/v1/models listing loaded adapters with their parent; and the renderers' flags for it. Playing SGLang, SGLang's."""
from __future__ import annotations

import json
import sys
import urllib.error
import urllib.request

import pytest

from llmgw.api import AdapterSlots, Model, ObjectMeta, Shard, ShardPorts, ShardSpec
from llmgw.dev.process import free_port
from llmgw.engines import NodeFacts, render
from tests.sim.test_sim import HOST, get, ready, sims  # noqa: F401 - sims is a fixture


def post(port: int, path: str, body: dict) -> tuple[int, str]:
    req = urllib.request.Request(f"http://{HOST}:{port}{path}", json.dumps(body).encode(),
                                 {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def message(text: str) -> tuple[str, str]:
    err = json.loads(text)["error"]
    return err["type"], err["message"]


def models(port: int) -> dict[str, str | None]:
    status, body = get(f"http://{HOST}:{port}/v1/models")
    assert status == 200
    return {m["id"]: m["parent"] for m in json.loads(body)["data"]}


def test_load_unload_and_requests_under_the_adapters_name(sims, tmp_path):
    port = free_port()
    sims("--host", HOST, "--port", str(port), "--served-model-name", "base", "--enable-lora", "--max-loras", "2",
         "--lora-load-seconds", "0.2")
    ready(port)
    sql, chat = tmp_path / "sql", tmp_path / "chat"
    sql.mkdir()
    chat.mkdir()
    completion = {"model": "sql", "prompt": "select", "max_tokens": 2}

    status, text = post(port, "/v1/completions", completion)
    assert (status, message(text)[0]) == (404, "NotFoundError"), "an adapter not loaded is no model"
    assert post(port, "/v1/load_lora_adapter", {"lora_name": "sql", "lora_path": str(sql)}) == (
        200, "Success: LoRA adapter 'sql' added successfully.")
    assert models(port) == {"base": None, "sql": "base"}
    status, text = post(port, "/v1/completions", completion)
    assert status == 200 and json.loads(text)["model"] == "sql"

    status, text = post(port, "/v1/load_lora_adapter", {"lora_name": "sql", "lora_path": str(sql)})
    assert (status, message(text)) == (400, ("InvalidUserInput", "The lora adapter 'sql' has already been loaded."))
    status, text = post(port, "/v1/load_lora_adapter", {"lora_name": "sql"})
    assert (status, message(text)) == (400, ("InvalidUserInput", "Both 'lora_name' and 'lora_path' must be provided."))
    status, text = post(port, "/v1/load_lora_adapter", {"lora_name": "gone", "lora_path": str(tmp_path / "no")})
    assert (status, message(text)[0]) == (404, "NotFoundError") and "No adapter found" in message(text)[1]
    assert post(port, "/v1/load_lora_adapter", {"lora_name": "chat", "lora_path": str(chat)})[0] == 200
    status, text = post(port, "/v1/load_lora_adapter", {"lora_name": "third", "lora_path": str(chat)})
    assert status == 400 and "--max-loras" in message(text)[1], "a third adapter past 2 slots"

    prompt = {"prompt": " ".join(["word"] * 64), "max_tokens": 1}
    cached = [json.loads(post(port, "/v1/completions", {**prompt, "model": m})[1])["usage"]["prompt_tokens_details"]
              ["cached_tokens"] for m in ("sql", "sql", "chat", "base")]
    assert cached[0] == 0 and cached[1] > 0, "an adapter's prompt hits its own cached blocks"
    assert cached[2:] == [0, 0], "never another adapter's, nor the base's"

    assert post(port, "/v1/unload_lora_adapter", {"lora_name": "sql"}) == (
        200, "Success: LoRA adapter 'sql' removed successfully.")
    status, text = post(port, "/v1/unload_lora_adapter", {"lora_name": "sql"})
    assert (status, message(text)) == (404, ("NotFoundError", "The lora adapter 'sql' cannot be found."))
    assert models(port) == {"base": None, "chat": "base"}
    assert post(port, "/v1/completions", completion)[0] == 404
    assert post(port, "/v1/load_lora_adapter", {"lora_name": "sql", "lora_path": str(sql)})[0] == 200
    status, text = post(port, "/v1/completions", {**prompt, "model": "sql"})
    assert json.loads(text)["usage"]["prompt_tokens_details"]["cached_tokens"] > 0, \
        "a load again under the same name finds its blocks: vLLM keys them by the adapter's name alone"


def test_playing_sglang_its_lora_api_its_answers_and_base_adapter_requests(sims, tmp_path):
    """--api sglang: SGLang's /load_lora_adapter and /unload_lora_adapter (a LoRAUpdateOutput, 200 or 400;
    FastAPI's 422 for a missing field), a load past the slots unloading the least recently used unpinned
    adapter, as SGLang's --max-loaded-loras does, and an adapter requested as BASE:ADAPTER."""
    port = free_port()
    sims("--host", HOST, "--port", str(port), "--served-model-name", "base", "--enable-lora", "--max-loras", "2",
         "--api", "sglang")
    ready(port)
    adapters = {}
    for name in ("sql", "chat", "third"):
        adapters[name] = tmp_path / name
        adapters[name].mkdir()
        (adapters[name] / "adapter_config.json").write_text("{}")

    def load(name: str, path: str, **more: object) -> tuple[int, dict]:
        status, text = post(port, "/load_lora_adapter", {"lora_name": name, "lora_path": path, **more})
        return status, json.loads(text)

    assert post(port, "/v1/load_lora_adapter", {"lora_name": "sql", "lora_path": str(adapters["sql"])})[0] == 404
    assert load("sql", str(adapters["sql"])) == (200, {
        "rid": None, "http_worker_ipc": None, "success": True, "error_message": "",
        "loaded_adapters": {"sql": str(adapters["sql"])}})
    assert models(port) == {"base": None, "sql": "base"}
    status, text = post(port, "/v1/completions", {"model": "base:sql", "prompt": "select", "max_tokens": 2})
    assert status == 200 and json.loads(text)["model"] == "base:sql"
    status, text = post(port, "/v1/completions", {"model": "base:nope", "prompt": "select", "max_tokens": 2})
    assert status == 400 and "not loaded: nope" in message(text)[1]

    status, doc = load("sql", str(adapters["sql"]))
    assert (status, doc["success"], doc["error_message"]) == (
        400, False, "Failed to load LoRA adapter sql because it is already loaded")
    status, doc = load("gone", str(tmp_path / "no"))
    assert status == 400 and "adapter_config.json" in doc["error_message"]
    status, text = post(port, "/load_lora_adapter", {"lora_name": "x"})
    assert status == 422 and [d["loc"] for d in json.loads(text)["detail"]] == [["body", "lora_path"]]

    assert load("chat", str(adapters["chat"]), pinned=True)[0] == 200
    assert load("third", str(adapters["third"]))[0] == 200, "past the slots SGLang unloads, it does not refuse"
    assert models(port) == {"base": None, "chat": "base", "third": "base"}, "sql went: the LRU unpinned one"

    status, text = post(port, "/unload_lora_adapter", {"lora_name": "third"})
    assert (status, json.loads(text)["loaded_adapters"]) == (200, {"chat": str(adapters["chat"])})
    status, text = post(port, "/unload_lora_adapter", {"lora_name": "third"})
    assert status == 400 and json.loads(text)["error_message"].startswith("LoRA with name third does not exist")


def test_without_enable_lora_there_is_no_lora_api(sims):
    port = free_port()
    sims("--host", HOST, "--port", str(port), "--served-model-name", "base")
    ready(port)
    assert post(port, "/v1/load_lora_adapter", {"lora_name": "a", "lora_path": "/"})[0] == 404


def _shard(engine: str, slots: AdapterSlots | None) -> Shard:
    spec = ShardSpec(replica="m-1", model="m", node="n0", rank=0, worldSize=1, gpus=[0],
                     ports=ShardPorts(serve=30000, distInit=30001), headAddress=HOST, engine=engine,
                     source="/models/m", servedModelNames=["m"], adapters=slots)
    return Shard(metadata=ObjectMeta(name="m-1-0"), spec=spec)


@pytest.mark.parametrize("engine", ["vllm", "sim"])
def test_a_model_with_adapters_renders_its_slots(engine):
    [cmd] = [c for c in render(_shard(engine, AdapterSlots(maxLoaded=3)), NodeFacts(HOST),
                               {"vllm": "vllm", "llmgw": sys.executable}).commands if c.serves]
    i = cmd.argv.index("--enable-lora")
    assert cmd.argv[i + 1:i + 3] == ["--max-loras", "3"]
    assert ("VLLM_ALLOW_RUNTIME_LORA_UPDATING" in cmd.env) == (engine == "vllm")
    [plain] = [c for c in render(_shard(engine, None), NodeFacts(HOST), {"vllm": "vllm"}).commands if c.serves]
    assert "--enable-lora" not in plain.argv and "VLLM_ALLOW_RUNTIME_LORA_UPDATING" not in plain.env


def test_a_profile_may_not_set_the_lora_flags():
    with pytest.raises(ValueError, match="args may not set --max-loras"):
        Model.model_validate({"metadata": {"name": "m"}, "spec": {
            "profiles": [{"engine": "vllm", "args": ["--max-loras", "9"]}]}})

"""Golden command lines of every engine x launch mode x rank, and the environment and probe of each."""
from __future__ import annotations

import sys

import pytest

from llmgw.api import AdapterSlots, KVBudget, ModelSpec, ObjectMeta, Shard, ShardPorts, ShardSpec
from llmgw.engines import ENGINES, NodeFacts, Probe, RenderError, render

EXE = {"vllm": "/opt/vllm/bin/vllm", "ray": "/opt/vllm/bin/ray", "sglang": "/opt/sglang/bin/python",
       "llama-server": "/usr/local/bin/llama-server", "python": "/usr/bin/python3"}
HEAD = "10.0.0.10"
ADAPTERS = [("mlx5_2", 1), ("mlx5_3", 1)]


def make_shard(engine: str, rank: int = 0, world: int = 1, launch_mode: str | None = None, **spec) -> Shard:
    fields = dict(
        replica="llama-70b-abc12", model="llama-70b", node=f"gpu-{rank}", rank=rank, worldSize=world,
        gpus=[0, 1, 2, 3, 4, 5, 6, 7], ports=ShardPorts(serve=30001, distInit=30002), headAddress=HEAD,
        fabric="ib-a" if world > 1 else None, engine=engine, launchMode=launch_mode, gpusPerNode=8,
        source="/models/llama-70b", servedModelNames=["llama-70b", "llama"],
        args=["--max-model-len", "8192"] if engine in ("vllm", "sglang") else [],
        env={"HF_HUB_OFFLINE": "1"},
    )
    fields.update(spec)
    return Shard(metadata=ObjectMeta(name=f"llama-70b-abc12-{rank}"), spec=ShardSpec(**fields))


def node(rank: int = 0, world: int = 1) -> NodeFacts:
    return NodeFacts(address=f"10.0.0.{10 + rank}", fabric_adapters=ADAPTERS if world > 1 else [])


def argvs(rendered) -> list[list[str]]:
    return [c.argv for c in rendered.commands]


# ------------------------------------------------------------------- vLLM mp

def test_vllm_mp_single_node():
    out = render(make_shard("vllm"), node(), EXE)
    assert argvs(out) == [[
        "/opt/vllm/bin/vllm", "serve", "/models/llama-70b",
        "--host", "10.0.0.10", "--port", "30001", "--served-model-name", "llama-70b", "llama",
        "--tensor-parallel-size", "8",
        "--max-model-len", "8192",
    ]]
    assert out.commands[0].serves and out.probe == Probe("http", "http://10.0.0.10:30001/health")


def test_vllm_mp_two_nodes_rank0_serves():
    out = render(make_shard("vllm", 0, 2, "mp"), node(0, 2), EXE)
    assert argvs(out) == [[
        "/opt/vllm/bin/vllm", "serve", "/models/llama-70b",
        "--host", "10.0.0.10", "--port", "30001", "--served-model-name", "llama-70b", "llama",
        "--tensor-parallel-size", "8", "--pipeline-parallel-size", "2",
        "--nnodes", "2", "--node-rank", "0", "--master-addr", "10.0.0.10", "--master-port", "30002",
        "--max-model-len", "8192",
    ]]
    assert out.commands[0].serves and out.probe.kind == "http"


def test_vllm_mp_two_nodes_rank1_is_headless():
    out = render(make_shard("vllm", 1, 2, "mp"), node(1, 2), EXE)
    assert argvs(out) == [[
        "/opt/vllm/bin/vllm", "serve", "/models/llama-70b",
        "--tensor-parallel-size", "8", "--pipeline-parallel-size", "2",
        "--nnodes", "2", "--node-rank", "1", "--master-addr", "10.0.0.10", "--master-port", "30002",
        "--headless",
        "--max-model-len", "8192",
    ]]
    assert not out.commands[0].serves
    assert out.probe == Probe("process", None)


# ------------------------------------------------------------------ vLLM ray

def test_vllm_ray_single_node_starts_a_head_then_serves():
    out = render(make_shard("vllm", launch_mode="ray"), node(), EXE)
    assert [c.name for c in out.commands] == ["ray-head", "vllm"]
    assert argvs(out) == [
        ["/opt/vllm/bin/ray", "start", "--head", "--port=30002", "--node-ip-address=10.0.0.10", "--num-gpus=8",
         "--block"],
        ["/opt/vllm/bin/vllm", "serve", "/models/llama-70b",
         "--host", "10.0.0.10", "--port", "30001", "--served-model-name", "llama-70b", "llama",
         "--tensor-parallel-size", "8", "--distributed-executor-backend", "ray",
         "--max-model-len", "8192"],
    ]
    assert [c.serves for c in out.commands] == [False, True]


def test_vllm_ray_two_nodes_rank0():
    out = render(make_shard("vllm", 0, 2, "ray"), node(0, 2), EXE)
    assert argvs(out) == [
        ["/opt/vllm/bin/ray", "start", "--head", "--port=30002", "--node-ip-address=10.0.0.10", "--num-gpus=8",
         "--block"],
        ["/opt/vllm/bin/vllm", "serve", "/models/llama-70b",
         "--host", "10.0.0.10", "--port", "30001", "--served-model-name", "llama-70b", "llama",
         "--tensor-parallel-size", "8", "--pipeline-parallel-size", "2", "--distributed-executor-backend", "ray",
         "--max-model-len", "8192"],
    ]
    assert out.probe == Probe("http", "http://10.0.0.10:30001/health")


def test_vllm_ray_two_nodes_rank1_only_joins_ray():
    out = render(make_shard("vllm", 1, 2, "ray"), node(1, 2), EXE)
    assert [c.name for c in out.commands] == ["ray-worker"]
    assert argvs(out) == [
        ["/opt/vllm/bin/ray", "start", "--address=10.0.0.10:30002", "--node-ip-address=10.0.0.11", "--num-gpus=8",
         "--block"],
    ]
    assert not out.commands[0].serves and out.probe.kind == "process"


# -------------------------------------------------------------------- SGLang

def test_sglang_single_node():
    out = render(make_shard("sglang"), node(), EXE)
    assert argvs(out) == [[
        "/opt/sglang/bin/python", "-m", "sglang.launch_server",
        "--model-path", "/models/llama-70b", "--host", "10.0.0.10", "--port", "30001",
        "--served-model-name", "llama-70b", "--tp-size", "8", "--enable-metrics",
        "--max-model-len", "8192",
    ]]
    assert out.commands[0].serves and out.probe.kind == "http"


@pytest.mark.parametrize("rank", [0, 1])
def test_sglang_with_adapters_loads_them_at_runtime_on_rank_0(rank):
    out = render(make_shard("sglang", rank, 2, adapters=AdapterSlots(maxLoaded=3)), node(rank, 2), EXE)
    argv = out.commands[0].argv
    lora = ["--enable-lora", "--max-loaded-loras", "3", "--max-loras-per-batch", "3"]
    assert (argv[argv.index("--enable-metrics") + 1:][:5] == lora) == (rank == 0)
    assert rank == 0 or "--enable-lora" not in argv


def test_llama_server_is_given_its_adapters_at_start_unapplied():
    facts = NodeFacts(address="10.0.0.10", loras=["/cache/a.gguf", "/cache/b.gguf"])
    argv = render(make_shard("llamacpp", adapters=AdapterSlots(maxLoaded=2)), facts, EXE).commands[0].argv
    i = argv.index("--lora-init-without-apply")
    assert argv[i + 1:i + 3] == ["--lora", "/cache/a.gguf,/cache/b.gguf"]
    none_yet = render(make_shard("llamacpp", adapters=AdapterSlots(maxLoaded=2)), node(), EXE).commands[0].argv
    assert "--lora-init-without-apply" in none_yet and "--lora" not in none_yet
    assert "--lora-init-without-apply" not in render(make_shard("llamacpp"), facts, EXE).commands[0].argv


@pytest.mark.parametrize("rank", [0, 1])
def test_sglang_two_nodes_tp_is_the_total(rank):
    out = render(make_shard("sglang", rank, 2), node(rank, 2), EXE)
    assert argvs(out) == [[
        "/opt/sglang/bin/python", "-m", "sglang.launch_server",
        "--model-path", "/models/llama-70b", "--host", f"10.0.0.{10 + rank}", "--port", "30001",
        "--served-model-name", "llama-70b", "--tp-size", "16", "--enable-metrics",
        "--nnodes", "2", "--node-rank", str(rank), "--dist-init-addr", "10.0.0.10:30002",
        "--max-model-len", "8192",
    ]]
    assert out.commands[0].serves == (rank == 0)
    assert out.probe.kind == ("http" if rank == 0 else "process")


def test_sglang_python_falls_back_to_the_configured_python():
    out = render(make_shard("sglang"), node(), {"python": "/usr/bin/python3"})
    assert out.commands[0].argv[:3] == ["/usr/bin/python3", "-m", "sglang.launch_server"]


# ------------------------------------------------------------------ llama.cpp

def test_llamacpp_single_node():
    out = render(make_shard("llamacpp", gpus=[3], gpusPerNode=1, args=["--ctx-size", "8192"]), node(), EXE)
    assert argvs(out) == [[
        "/usr/local/bin/llama-server", "--model", "/models/llama-70b", "--host", "10.0.0.10", "--port", "30001",
        "--metrics", "--alias", "llama-70b,llama", "--parallel", "4", "--kv-unified", "--n-gpu-layers", "999",
        "--ctx-size", "8192",
    ]]
    assert out.commands[0].env["CUDA_VISIBLE_DEVICES"] == "3"
    assert out.probe == Probe("http", "http://10.0.0.10:30001/health")


def test_llamacpp_refuses_a_multi_node_shard():
    with pytest.raises(RenderError, match="single-node.*worldSize is 2"):
        render(make_shard("llamacpp", 0, 2), node(0, 2), EXE)


# ------------------------------------------------------------------------ sim

@pytest.mark.parametrize("rank,world", [(0, 1), (0, 2), (1, 2)])
def test_sim_every_rank_runs_the_same_line_with_its_rank(rank, world):
    out = render(make_shard("sim", rank, world, args=["--load-seconds", "2"]), node(rank, world), {})
    assert argvs(out) == [[
        sys.executable, "-m", "llmgw.sim",
        "--host", f"10.0.0.{10 + rank}", "--port", "30001", "--served-model-name", "llama-70b", "llama",
        "--rank", str(rank), "--world-size", str(world), "--dist-init-addr", "10.0.0.10:30002",
        "--model", "/models/llama-70b",     # spec.source: the sim checks the path is there
        "--load-seconds", "2",
    ]]
    assert out.commands[0].serves == (rank == 0)
    assert out.probe.kind == ("http" if rank == 0 else "process")


def test_sim_uses_a_configured_llmgw_executable():
    out = render(make_shard("sim"), node(), {"llmgw": "/opt/llmgw/bin/llmgw"})
    assert out.commands[0].argv[:3] == ["/opt/llmgw/bin/llmgw", "sim", "--host"]


# ------------------------------------------------------------ environment

def test_env_of_a_multi_node_shard():
    out = render(make_shard("vllm", 1, 2, "mp", gpus=[4, 5, 6, 7], gpusPerNode=4), node(1, 2), EXE)
    assert out.commands[0].env == {
        "HF_HUB_OFFLINE": "1",
        "CUDA_VISIBLE_DEVICES": "4,5,6,7",
        "NCCL_IB_HCA": "=mlx5_2:1,mlx5_3:1",
        "VLLM_HOST_IP": "10.0.0.11",
    }


def test_every_command_of_a_ray_shard_gets_the_same_env():
    out = render(make_shard("vllm", 0, 2, "ray"), node(0, 2), EXE)
    ray, serve = out.commands
    assert ray.env == {k: v for k, v in serve.env.items() if k != "RAY_ADDRESS"}
    assert ray.env["NCCL_IB_HCA"] == "=mlx5_2:1,mlx5_3:1" and ray.env["VLLM_HOST_IP"] == "10.0.0.10"


@pytest.mark.parametrize("engine", ["sglang", "llamacpp", "sim"])
def test_island_shards_set_no_nccl_hca_and_only_vllm_sets_its_host_ip(engine):
    env = render(make_shard(engine, gpus=[2]), node(), EXE).commands[0].env
    assert env == {"HF_HUB_OFFLINE": "1", "CUDA_VISIBLE_DEVICES": "2"}


def test_the_placement_overrides_a_profile_env_that_names_other_gpus():
    env = render(make_shard("vllm", gpus=[1], env={"CUDA_VISIBLE_DEVICES": "0,1,2,3", "NCCL_DEBUG": "INFO"}),
                 node(), EXE).commands[0].env
    assert env["CUDA_VISIBLE_DEVICES"] == "1" and env["NCCL_DEBUG"] == "INFO"


# ------------------------------------------------------------- edge cases

def test_ipv6_head_is_bracketed_in_host_port_forms():
    shard = make_shard("sglang", 1, 2, headAddress="fd00::10")
    argv = render(shard, NodeFacts("fd00::11", ADAPTERS), EXE).commands[0].argv
    assert argv[argv.index("--dist-init-addr") + 1] == "[fd00::10]:30002"
    ray = render(make_shard("vllm", 1, 2, "ray", headAddress="fd00::10"), NodeFacts("fd00::11"), EXE)
    assert "--address=[fd00::10]:30002" in ray.commands[0].argv


def test_probe_of_a_wildcard_bind_goes_to_loopback():
    out = render(make_shard("sim"), NodeFacts("0.0.0.0"), {})
    assert out.probe.url == "http://127.0.0.1:30001/health"


@pytest.mark.parametrize("engine", ["vllm", "sglang", "llamacpp"])
def test_engines_that_load_weights_need_a_source(engine):
    with pytest.raises(RenderError, match="spec.source on model llama-70b"):
        render(make_shard(engine, source=None), node(), EXE)


def test_programs_default_to_their_names_on_path():
    assert render(make_shard("vllm"), node(), {}).commands[0].argv[0] == "vllm"
    assert render(make_shard("llamacpp", args=[]), node(), {}).commands[0].argv[0] == "llama-server"



def test_vllm_under_ray_joins_its_own_head_once_it_listens_and_the_head_stops_itself():
    """ray.init() without an address joins the machine's newest Ray cluster: RAY_ADDRESS names this one."""
    head, serve = render(make_shard("vllm", 0, 2, "ray"), node(0, 2), EXE).commands
    assert serve.env["RAY_ADDRESS"] == "10.0.0.10:30002"
    assert head.listens == ("10.0.0.10", 30002) and serve.listens is None
    assert head.term_leader and not serve.term_leader
    (worker,) = render(make_shard("vllm", 1, 2, "ray"), node(1, 2), EXE).commands
    assert worker.listens is None and worker.term_leader


# ------------------------------------------------------------------- KV events (precise-prefix)

KV_CONFIG = ('{"enable_kv_cache_events":true,"publisher":"zmq","endpoint":"tcp://*:30003",'
             '"replay_endpoint":"tcp://*:30004"}')


@pytest.mark.parametrize("launch_mode", ["mp", "ray"])
def test_vllm_publishes_kv_events_on_its_ports_with_keys_the_gateway_computes(launch_mode):
    ports = ShardPorts(serve=30001, distInit=30002, kvEvents=30003, kvReplay=30004)
    out = render(make_shard("vllm", launch_mode=launch_mode, ports=ports), node(), EXE)
    serve = out.commands[-1]
    at = serve.argv.index("--kv-events-config")
    assert serve.argv[at:at + 4] == ["--kv-events-config", KV_CONFIG, "--prefix-caching-hash-algo", "sha256_cbor"]
    assert serve.argv[-2:] == ["--max-model-len", "8192"]  # the Model's own args come last
    assert serve.env["PYTHONHASHSEED"] == "0"


def test_the_sim_publishes_kv_events_and_a_shard_without_the_ports_nothing():
    ports = ShardPorts(serve=30001, distInit=30002, kvEvents=30003, kvReplay=30004)
    sim = render(make_shard("sim", ports=ports), node(), {}).commands[0]
    assert sim.argv[sim.argv.index("--kv-events-config") + 1] == KV_CONFIG and sim.env["PYTHONHASHSEED"] == "0"
    for engine in ("vllm", "sim", "llamacpp"):
        plain = render(make_shard(engine), node(), EXE).commands[-1]
        assert "--kv-events-config" not in plain.argv and "PYTHONHASHSEED" not in plain.env


def test_sglang_publishes_kv_events_on_rank_0_with_its_own_config():
    """SGLang's KVEventsConfig (0.5.23) has no enable field: the flag turns publishing on, with the publisher
    named (its default is "null"); only rank 0 (its scheduler's KV cache) is given the ports."""
    ports = ShardPorts(serve=30001, distInit=30002, kvEvents=30003, kvReplay=30004)
    (head,) = render(make_shard("sglang", world=2, ports=ports), node(0, 2), EXE).commands
    at = head.argv.index("--kv-events-config")
    assert head.argv[at + 1] == '{"publisher":"zmq","endpoint":"tcp://*:30003","replay_endpoint":"tcp://*:30004"}'
    assert head.argv[-2:] == ["--max-model-len", "8192"] and head.env["PYTHONHASHSEED"] == "0"
    (other,) = render(make_shard("sglang", rank=1, world=2), node(1, 2), EXE).commands
    assert "--kv-events-config" not in other.argv


# ------------------------------------------------------------------ KV budget

# A replica the scheduler placed on GPUs of 81559 MiB with 40000 MiB free: 20 GiB of KV, 163840 tokens.
BUDGET = KVBudget(gpuMiB=81559, freeMiB=40000, bytes=20 << 30, tokens=163840)


@pytest.mark.parametrize("engine, flags, own", [
    # (40000 MiB - 1 GiB of CUDA context) / 81559 MiB, rounded down: vLLM's share, under its 0.9
    ("vllm", ["--gpu-memory-utilization", "0.477"], ["--gpu-memory-utilization=0.8"]),
    ("sglang", ["--max-total-tokens", "163840"], ["--mem-fraction-static", "0.7"]),
    ("llamacpp", ["--ctx-size", "163840"], ["-c", "8192"]),
])
def test_a_placed_replica_tells_its_engine_the_budget_unless_the_model_says_its_own(engine, flags, own):
    argv = argvs(render(make_shard(engine, kvCache=BUDGET), node(), EXE))[0]
    at = argv.index(flags[0])
    assert argv[at:at + 2] == flags
    # without a budget (no estimate, or GPUs that report no memory) the engine sizes its cache itself
    assert flags[0] not in argvs(render(make_shard(engine), node(), EXE))[0]
    # the Model's args say theirs: only theirs is given
    argv = argvs(render(make_shard(engine, kvCache=BUDGET, args=own), node(), EXE))[0]
    assert flags[0] not in argv and argv[-len(own):] == own


def test_vllm_is_never_asked_for_more_than_its_default_share():
    idle = KVBudget(gpuMiB=81559, freeMiB=81556, bytes=70 << 30, tokens=573440)
    argv = argvs(render(make_shard("vllm", kvCache=idle), node(), EXE))[0]
    assert argv[argv.index("--gpu-memory-utilization") + 1] == "0.900"


@pytest.mark.parametrize("engine, args, floor", [
    ("vllm", ["--max-model-len", "32768"], 32768),
    ("vllm", ["--max-model-len=8192", "--max-model-len", "16384"], 16384),   # the last, as argparse reads it
    ("sglang", ["--context-length", "65536"], 65536),
    ("llamacpp", ["-c", "4096"], 4096),
    ("llamacpp", ["--ctx-size=0"], None),                 # 0: llama.cpp's "the model's own", no floor
    ("vllm", ["--max-model-len", "32k"], None),           # not a whole number: vLLM itself says what it reads
    ("vllm", ["--enforce-eager"], None),
])
def test_the_context_floor_a_profile_sets_through_its_engine_flag(engine, args, floor):
    assert ENGINES[engine].context_floor(args) == floor


def test_a_models_floor_is_the_larger_of_its_min_context_and_its_engine_flag():
    def spec(min_context, args):
        return ModelSpec.model_validate({"minContext": min_context, "profiles": [{"engine": "vllm", "args": args}]})
    assert spec(8192, ["--max-model-len", "32768"]).context_floor(0) == 32768
    assert spec(65536, ["--max-model-len", "32768"]).context_floor(0) == 65536
    assert spec(None, []).context_floor(0) is None


def test_llamacpp_holds_at_most_the_models_own_context_in_each_slot():
    # a small model on a large GPU: 4 slots x its 8192 tokens, not the 163840 the GPU would hold
    small = BUDGET.model_copy(update={"modelContext": 8192})
    argv = argvs(render(make_shard("llamacpp", kvCache=small), node(), EXE))[0]
    assert argv[argv.index("--ctx-size") + 1] == "32768"


def test_a_single_node_sglang_replica_that_publishes_pages_16_tokens_unless_its_args_say():
    """SGLang's default page is one token (the index would hold a key per token); its events say the page,
    which the gateway keys with. A multi-node replica's ranks past 0 cannot tell, so none is given it."""
    ports = ShardPorts(serve=30001, distInit=30002, kvEvents=30003, kvReplay=30004)
    (one,) = render(make_shard("sglang", ports=ports), node(), EXE).commands
    assert one.argv[-4:] == ["--page-size", "16", "--max-model-len", "8192"]
    (theirs,) = render(make_shard("sglang", ports=ports, args=["--page-size=64"]), node(), EXE).commands
    assert "--page-size" not in theirs.argv and theirs.argv[-1] == "--page-size=64"
    (head,) = render(make_shard("sglang", world=2, ports=ports), node(0, 2), EXE).commands
    assert "--page-size" not in head.argv
    assert "--page-size" not in render(make_shard("sglang"), node(), EXE).commands[0].argv


@pytest.mark.parametrize("launch_mode", ["mp", "ray"])
def test_vllm_with_adapters_allows_runtime_loads_as_vllm_reads_its_env(launch_mode):
    """vLLM 0.11.1's envs.py: VLLM_ALLOW_RUNTIME_LORA_UPDATING is on when `value.strip().lower()` is 1 or true;
    without it /v1/load_lora_adapter is not served."""
    serve = render(make_shard("vllm", launch_mode=launch_mode, adapters=AdapterSlots(maxLoaded=3)), node(),
                   EXE).commands[-1]
    assert serve.env["VLLM_ALLOW_RUNTIME_LORA_UPDATING"].strip().lower() in ("1", "true")
    at = serve.argv.index("--enable-lora")
    assert serve.argv[at:at + 3] == ["--enable-lora", "--max-loras", "3"]

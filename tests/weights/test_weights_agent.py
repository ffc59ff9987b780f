"""The agent's pull phase, as real processes: `llmgw agent` against a real server, sim engines, and
weights from a loopback hub speaking huggingface_hub's endpoints (tests/fixtures/weights_origin.py)."""
from __future__ import annotations

from pathlib import Path

from llmgw.api import Node, PullStatus, Shard, ShardStatus, get_condition
from llmgw.printers.kinds import table
from tests.agent.test_agent_e2e import agents, shard_in, sim_shard, wait_for  # noqa: F401
from tests.fixtures.cluster import shared_api_server  # noqa: F401
from tests.fixtures.weights_origin import WeightsOrigin, content_digest, generated, origin  # noqa: F401

FILES = {"config.json": 400, "model.safetensors": 3_000_000, "tokenizer/tokenizer.json": 20_000}


def cmdline(pid: int) -> list[str]:
    return Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")


async def test_hf_shard_pulls_resumes_and_starts_its_engine_on_the_cached_copy(shared_api_server, agents, origin):
    files = generated(11, FILES)
    commit = origin.add_repo("org/tiny", files)
    origin.drop_after("org/tiny/model.safetensors", 1_000_000)     # the first fetch is cut short
    agent = agents("pull-1", "--hub-endpoint", origin.url)
    async with shared_api_server.client() as c:
        await c.create(sim_shard("pull-1-a", "pull-1", source="hf://org/tiny"))
        shard = await shard_in(c, "pull-1-a", agent, "Ready", "Failed")
        assert shard.status.phase == "Ready", shard.status
        digest = content_digest(files)
        total = sum(len(d) for d in files.values())
        assert shard.status.pull == PullStatus(digest=digest, bytesDone=total, bytesTotal=total)
        pulled = get_condition(shard.status.conditions, "Pulled")
        assert pulled is not None and pulled.status == "True" and digest in pulled.message
        assert f"hf://org/tiny@main (hf://org/tiny@{commit})" in pulled.message    # the branch's commit
        # The engine runs on the cache's verified copy, not on the hf:// string.
        argv = cmdline(shard.status.pid)
        model = Path(argv[argv.index("--model") + 1])
        assert model == agent.state_dir / "weights" / "models" / digest.removeprefix("sha256:")
        assert (model / "tokenizer" / "tokenizer.json").read_bytes() == files["tokenizer/tokenizer.json"]
        # The cut fetch resumed where it stopped.
        ranges = [r.range for r in origin.requests(suffix="model.safetensors")]
        assert ranges[0] is None and any(r and r != "bytes=0-" for r in ranges[1:]), ranges

        async def cached():
            node = await c.get(Node, "pull-1")
            w = node.status.weights
            return w if w is not None and [m.digest for m in w.models] == [digest] else None
        weights = await wait_for("the Node lists the cached digest", cached, agent)
        assert weights.models[0].bytes == total and 0 < weights.freeBytes <= weights.capacityBytes


async def test_corrupted_weights_never_reach_an_engine(shared_api_server, agents, origin):
    files = generated(12, FILES)
    origin.add_repo("org/bad", files)
    origin.corrupt("org/bad/model.safetensors")
    agent = agents("pull-2", "--hub-endpoint", origin.url)
    async with shared_api_server.client() as c:
        await c.create(sim_shard("pull-2-a", "pull-2", source="hf://org/bad"))
        shard = await shard_in(c, "pull-2-a", agent, "Ready", "Failed")
    assert shard.status.phase == "Failed" and shard.status.pid is None
    cond = get_condition(shard.status.conditions, "Pulled")
    assert cond is not None and (cond.status, cond.reason) == ("False", "ChecksumMismatch")
    assert "model.safetensors" in cond.message and "ChecksumMismatch" in shard.status.message
    assert not (agent.state_dir / "logs" / "pull-2-a").exists()      # no engine was ever started
    assert list((agent.state_dir / "weights" / "models").iterdir()) == []


async def test_a_pull_the_cache_cannot_hold_fails_with_cache_full(shared_api_server, agents, origin):
    origin.add_repo("org/big", generated(13, FILES))
    agent = agents("pull-3", "--hub-endpoint", origin.url, "--weights-cache-size", "1Mi")
    async with shared_api_server.client() as c:
        await c.create(sim_shard("pull-3-a", "pull-3", source="hf://org/big"))
        shard = await shard_in(c, "pull-3-a", agent, "Ready", "Failed")
    cond = get_condition(shard.status.conditions, "Pulled")
    assert cond is not None and cond.reason == "CacheFull" and shard.status.pid is None, shard.status
    assert origin.requests(suffix="model.safetensors") == []


async def test_sim_refuses_to_start_on_a_missing_path(shared_api_server, agents, tmp_path):
    agent = agents("pull-4")
    async with shared_api_server.client() as c:
        await c.create(sim_shard("pull-4-a", "pull-4", source=str(tmp_path / "no-such-model")))
        shard = await shard_in(c, "pull-4-a", agent, "Ready", "Failed")
    assert shard.status.phase == "Failed"
    assert any("no such file or directory" in line for line in shard.status.logTail), shard.status.logTail


def test_get_shards_shows_a_pulls_share():
    shard = sim_shard("s", "n", source="hf://org/m")
    shard.status = ShardStatus(phase="Pulling", pull=PullStatus(bytesDone=3, bytesTotal=4))
    _, rows = table(Shard, [shard])
    assert rows[0][3] == "Pulling 75%"


def test_a_replica_with_a_pulling_shard_is_starting_and_says_how_far():
    from controllers.replica import fold_phase, pulling_message
    pulling = sim_shard("s", "node-a", source="hf://org/m")
    pulling.status = ShardStatus(phase="Pulling", pull=PullStatus(bytesDone=1_200_000_000, bytesTotal=4_000_000_000))
    resolving = sim_shard("t", "node-b", source="hf://org/m")
    resolving.status = ShardStatus(phase="Pulling")
    assert fold_phase(None, [pulling]) == "Starting"
    assert pulling_message([pulling, resolving]) == "pulling weights: node-a 1.2 GB of 4.0 GB, node-b resolving"

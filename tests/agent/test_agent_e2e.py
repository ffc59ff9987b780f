"""The agent as a real process against a real `llmgw server` (and etcd), running real sim engines.

Tests play the controllers: they create Shards for the agent's node as an admin
and delete them, and watch what the agent reports.
"""
from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from llmgw.agent.process import is_alive, start_time
from llmgw.agent.registration import Registration
from llmgw.api import Node, NodeStatus, ObjectMeta, Shard, ShardPorts, ShardSpec, condition_true, get_condition
from llmgw.client import NotFound
from llmgw.dev.process import free_port
from llmgw.store import Store
from llmgw.store import keys as K
from tests.fixtures.cluster import shared_api_server  # noqa: F401
from tests.fixtures.poll import until

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "hack" / "fakes"))
from make_sysfs import FakePort, make_sysfs

REPO = Path(__file__).resolve().parents[2]
LLMGW = Path(sys.executable).parent / "llmgw"
FAKE_SMI = REPO / "hack" / "fakes" / "nvidia-smi"
WAIT = 60.0      # upper bound for anything to happen (a failure, never a measurement)



class AgentProcess:
    """`llmgw agent` for one node, with a fake nvidia-smi, no fabrics, and its own state dir."""

    def __init__(self, server, node: str, workdir: Path, *extra: str):
        self.server, self.node, self.dir = server, node, workdir
        self.state_dir = workdir / "state"
        self.log = workdir / "agent.log"
        cert, key = server.issue_node(node)
        self.argv = [str(LLMGW), "agent", "--node", node, "--server", server.url, "--ca", server.ca,
                     "--cert", cert, "--key", key, "--state-dir", str(self.state_dir),
                     "--advertise-address", "127.0.0.1", "--ib-root", str(workdir / "no-ib"),
                     "--drain-delay", "0.2", "--stop-grace-period", "5", "--heartbeat-interval", "1",
                     *extra]
        if "--nvidia-smi" not in extra:
            self.argv += ["--nvidia-smi", str(FAKE_SMI)]
        self.proc: subprocess.Popen | None = None

    def start(self) -> "AgentProcess":
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(self.argv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                                         env={**os.environ, "FAKE_NVIDIA_SMI_GPUS": "2", "PYTHONUNBUFFERED": "1"})
        return self

    def stop(self) -> None:
        """SIGTERM the agent alone, as systemd's KillMode=process does."""
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def tail(self) -> str:
        return "\n".join(self.log.read_text().splitlines()[-30:]) if self.log.exists() else ""


@pytest.fixture
def agents(shared_api_server, tmp_path):
    started: list[AgentProcess] = []

    def make(node: str, *extra: str) -> AgentProcess:
        a = AgentProcess(shared_api_server, node, tmp_path / node, *extra)
        a.dir.mkdir(parents=True, exist_ok=True)
        started.append(a)
        return a.start()
    yield make
    for a in started:
        a.stop()
        kill_recorded_engines(a.state_dir)


def kill_recorded_engines(state_dir: Path) -> None:
    """Engines outlive agents by design: end a test's leftovers by their recorded pids."""
    for rec in (state_dir / "shards").glob("*.json") if (state_dir / "shards").exists() else []:
        for p in json.loads(rec.read_text())["processes"]:
            if is_alive(p["pid"], p["start_time"]):
                os.killpg(p["pid"], signal.SIGKILL)


def sim_shard(name: str, node: str, *, engine: str = "sim", source: str | None = None,
              finalizers: list[str] | None = None, fabric: str | None = None, gpus: tuple[int, ...] = (0,)) -> Shard:
    return Shard(
        metadata=ObjectMeta(name=name, finalizers=finalizers or []),
        spec=ShardSpec(replica=f"{name}-r", model="m", node=node, rank=0, worldSize=1, gpus=list(gpus),
                       ports=ShardPorts(serve=free_port(), distInit=free_port()), headAddress="127.0.0.1",
                       engine=engine, source=source, servedModelNames=["m"], fabric=fabric),
    )


async def wait_for(what: str, probe, agent: AgentProcess, timeout: float = WAIT):
    """`until` for a test of one agent: a NotFound is "not yet", and if the agent exits
    there is nothing left to wait for; a failure shows the agent's log."""
    def alive_probe():
        if agent.proc.poll() is not None:
            raise AssertionError(f"{what}: the agent exited with {agent.proc.poll()}; log:\n{agent.tail()}")
        return probe()
    return await until(alive_probe, what, timeout=timeout, interval=0.1, retry=(NotFound,),
                       detail=lambda: f"agent log:\n{agent.tail()}")


async def shard_in(c, name: str, agent: AgentProcess, *phases: str) -> Shard:
    async def probe():
        s = await c.get(Shard, name)
        return s if s.status.phase in phases else None
    return await wait_for(f"shard {name} in {phases}", probe, agent)


# ------------------------------------------------------------------- tests

async def test_registers_its_node_with_discovered_gpus(shared_api_server, agents):
    agent = agents("reg-1")
    async with shared_api_server.client() as c:
        async def registered():
            try:
                n = await c.get(Node, "reg-1")
            except NotFound:
                return None
            return n if n.status.gpus else None
        node = await wait_for("node registered", registered, agent)
        st = node.status
        assert [g.index for g in st.gpus] == [0, 1]
        assert st.addresses == ["127.0.0.1"]
        assert condition_true(st.conditions, "GPUDiscovery")
        assert get_condition(st.conditions, "Ready").reason == "AgentReady"
        assert "sim" in {e.name for e in st.engines}
        assert st.fabrics == []
        assert st.agentVersion


async def test_free_gpu_memory_is_reported_again_when_it_moves_by_a_step(shared_api_server, agents, tmp_path):
    """Placement compares each GPU's free memory with a model's estimate: the agent reads it again
    every --gpu-memory-interval and writes the Node only when a GPU's figure moved by
    --gpu-memory-step MiB or more (not at every allocation of a running engine)."""
    used, reads = tmp_path / "used", tmp_path / "reads"
    used.write_text("3")
    smi = tmp_path / "nvidia-smi"
    smi.write_text(f'#!/bin/sh\necho >> "{reads}"\nexec "{FAKE_SMI}" --fake-gpus=1 --fake-used=$(cat "{used}") "$@"\n')
    smi.chmod(0o755)
    agent = agents("mem-1", "--nvidia-smi", str(smi), "--gpu-memory-interval", "0.2", "--gpu-memory-step", "1024")
    async with shared_api_server.client() as c:
        async def free() -> int | None:
            try:
                n = await c.get(Node, "mem-1")
            except NotFound:
                return None
            return n.status.gpus[0].memoryFreeMiB if n.status.gpus else None
        assert await wait_for("node registered", free, agent) == 81556

        used.write_text("1003")      # 1000 MiB less free: under the step, no write
        seen = len(reads.read_text().splitlines())
        await wait_for("two more reads", lambda: len(reads.read_text().splitlines()) >= seen + 2, agent)
        assert await free() == 81556   # (with --gpu-memory-step 0 it reads 80556 here)

        used.write_text("40003")     # an engine took 40,000 MiB: reported

        async def moved() -> bool:
            return await free() == 41556
        await wait_for("the new figure", moved, agent)


async def test_registers_its_node_before_it_heartbeats(shared_api_server, agents):
    """The server takes heartbeats of registered Nodes only (a heartbeat of an unknown node is
    404), so the agent creates its Node first; the node-lifecycle controller leaves a Node that
    never reported Ready alone until then (tests/controllers/test_controller_nodelifecycle.py), so there is
    no NotReady false alarm on every start. etcd's watch gives the order of the writes."""
    node = "reg-hb"
    async with Store(shared_api_server.etcd) as store:
        rev = await store.revision()
        order: list[str] = []

        async def watch():
            async for ev in store.kv.watch("/llmgw/", rev + 1):
                if ev.key in (K.heartbeat_key(node), K.object_key(K.SPEC, "nodes", node)) and ev.key not in order:
                    order.append(ev.key)
                    if len(order) == 2:
                        return
        watching = asyncio.create_task(watch())      # from a revision before the agent starts
        agent = agents(node)
        try:
            await asyncio.wait_for(watching, WAIT)
        except asyncio.TimeoutError:
            raise AssertionError(f"saw only {order}; agent log:\n{agent.tail()}") from None
    assert order == [K.object_key(K.SPEC, "nodes", node), K.heartbeat_key(node)]


async def test_a_beat_the_server_holds_for_its_window_is_answered_not_failed(shared_api_server):
    """A server gathers beats up to a window (1.5 s at the default 15 s ttl) before it writes them:
    an agent whose heartbeat interval is shorter than that waits for the answer (its timeout is
    the interval and the window), where it would give the beat up, count the node disconnected
    and move to the next server (seen failing with the interval alone)."""
    node = "window-hb"
    async with shared_api_server.client() as admin:
        await admin.create(Node(metadata=ObjectMeta(name=node)))
    async with shared_api_server.client(shared_api_server.issue_node(node)) as c:
        reg = Registration(c, node, heartbeat_interval=0.5)
        await reg.register(NodeStatus())
        beat, answers, failures = c.heartbeat, [], []

        async def recorded(*a, **kw):
            try:
                answers.append(await beat(*a, **kw))
            except Exception as err:
                failures.append(err)
                raise
            return answers[-1]
        c.heartbeat = recorded
        loop = asyncio.create_task(reg.heartbeat_loop())
        try:
            await until(lambda: len(answers) + len(failures) >= 4, "four beats answered or failed", timeout=WAIT)
        finally:
            loop.cancel()
    assert failures == [] and reg.connected.is_set(), failures


async def test_failed_gpu_discovery_registers_with_a_condition_naming_the_path(shared_api_server, agents, tmp_path):
    missing = tmp_path / "nowhere" / "nvidia-smi"
    agent = agents("nogpu-1", "--nvidia-smi", str(missing))
    async with shared_api_server.client() as c:
        async def registered():
            try:
                n = await c.get(Node, "nogpu-1")
            except NotFound:
                return None
            return n if get_condition(n.status.conditions, "GPUDiscovery") else None
        node = await wait_for("node registered", registered, agent)
    cond = get_condition(node.status.conditions, "GPUDiscovery")
    assert cond.status == "False"
    assert cond.message == f"nvidia-smi not found: {missing}"
    assert node.status.gpus == []
    cert, key = shared_api_server.admin
    shown = subprocess.run([str(LLMGW), "get", "nodes", "nogpu-1", "--server", shared_api_server.url,
                            "--ca", shared_api_server.ca, "--cert", cert, "--key", key],
                           capture_output=True, text=True)
    assert shown.returncode == 0, shown.stderr
    assert "GPUDiscoveryFailed" in shown.stdout


async def test_shard_starts_becomes_ready_and_fails_with_the_exit_code_when_killed(shared_api_server, agents):
    agent = agents("run-1")
    async with shared_api_server.client() as c:
        await c.create(sim_shard("run-1-a", "run-1"))
        shard = await shard_in(c, "run-1-a", agent, "Ready", "Failed")
        assert shard.status.phase == "Ready", shard.status
        pid = shard.status.pid
        assert is_alive(pid)
        assert os.getpgid(pid) == pid, "the engine leads its own process group"
        environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        assert b"CUDA_VISIBLE_DEVICES=0" in environ
        assert (agent.state_dir / "logs" / "run-1-a" / "sim.log").exists()

        os.kill(pid, signal.SIGKILL)
        shard = await shard_in(c, "run-1-a", agent, "Failed")
        assert shard.status.exitCode == 137
        assert "killed by signal SIGKILL" in shard.status.message
        assert not (agent.state_dir / "shards" / "run-1-a.json").exists()


async def test_a_hung_engine_is_stopped_and_its_shard_failed_after_the_liveness_timeout(shared_api_server, agents):
    """An engine that stops answering (here SIGSTOP: alive, holding its port and GPUs, silent) is
    not left unready forever: after --liveness-timeout of failed probes the agent kills it and
    fails the shard, so the replica controller rebuilds the replica (issue 33)."""
    agent = agents("hung-1", "--liveness-timeout", "2")
    async with shared_api_server.client() as c:
        await c.create(sim_shard("hung-1-a", "hung-1"))
        shard = await shard_in(c, "hung-1-a", agent, "Ready", "Failed")
        assert shard.status.phase == "Ready", shard.status
        pid = shard.status.pid
        os.kill(pid, signal.SIGSTOP)
        shard = await shard_in(c, "hung-1-a", agent, "Failed")
        assert shard.status.message.startswith("unhealthy: health probe") and "failing for 2s" in shard.status.message
        await until(lambda: not is_alive(pid), "the stopped engine killed")


async def test_restarted_agent_adopts_the_running_engine(shared_api_server, agents):
    agent = agents("adopt-1")
    async with shared_api_server.client() as c:
        await c.create(sim_shard("adopt-1-a", "adopt-1"))
        shard = await shard_in(c, "adopt-1-a", agent, "Ready", "Failed")
        assert shard.status.phase == "Ready", shard.status
        pid = shard.status.pid
        started = start_time(pid)

        agent.stop()
        assert is_alive(pid, started), "stopping the agent stopped its engine"
        agent.start()
        await wait_for("agent adopted the engine",
                       lambda: "adopted running engine" in agent.log.read_text(), agent)
        shard = await c.get(Shard, "adopt-1-a")
        assert shard.status.phase == "Ready"
        assert shard.status.pid == pid
        assert is_alive(pid, started), "the engine was restarted, not adopted"

        # The adopted engine is still supervised: deleting the shard stops it and confirms.
        await c.update(shard.model_copy(update={"metadata": shard.metadata.model_copy(
            update={"finalizers": ["test/keep"]})}))
        await c.delete(Shard, "adopt-1-a")
        shard = await shard_in(c, "adopt-1-a", agent, "Stopped")
        assert not is_alive(pid, started)


async def test_deleted_shard_is_stopped_and_confirmed(shared_api_server, agents):
    agent = agents("stop-1")
    async with shared_api_server.client() as c:
        await c.create(sim_shard("stop-1-a", "stop-1", finalizers=["llmgw.io/replica"]))
        shard = await shard_in(c, "stop-1-a", agent, "Ready", "Failed")
        pid, started = shard.status.pid, start_time(shard.status.pid)
        await c.delete(Shard, "stop-1-a")
        shard = await shard_in(c, "stop-1-a", agent, "Stopped")
        assert not is_alive(pid, started)
        assert shard.metadata.deletionTimestamp is not None
        assert not (agent.state_dir / "shards" / "stop-1-a.json").exists()


async def test_missing_engine_executable_fails_the_shard_naming_the_path(shared_api_server, agents, tmp_path):
    vllm = tmp_path / "opt" / "vllm" / "bin" / "vllm"
    weights = tmp_path / "models" / "m"
    weights.mkdir(parents=True)
    agent = agents("noexe-1", "--engine", f"vllm={vllm}")
    async with shared_api_server.client() as c:
        await c.create(sim_shard("noexe-1-a", "noexe-1", engine="vllm", source=str(weights)))
        shard = await shard_in(c, "noexe-1-a", agent, "Failed", "Ready")
        assert shard.status.phase == "Failed"
        assert f"executable file not found: {vllm}" in shard.status.message
        node = await c.get(Node, "noexe-1")
        assert "vllm" not in {e.name for e in node.status.engines}
        assert f"executable file not found: {vllm}" in get_condition(node.status.conditions, "EnginesFound").message


async def test_engine_of_a_shard_deleted_while_the_agent_was_away_is_stopped(shared_api_server, agents):
    agent = agents("orphan-1")
    async with shared_api_server.client() as c:
        await c.create(sim_shard("orphan-1-a", "orphan-1"))
        shard = await shard_in(c, "orphan-1-a", agent, "Ready", "Failed")
        pid, started = shard.status.pid, start_time(shard.status.pid)
        agent.stop()
        await c.delete(Shard, "orphan-1-a")
        assert is_alive(pid, started)
        agent.start()
        record = agent.state_dir / "shards" / "orphan-1-a.json"
        await wait_for("orphaned engine stopped and its record removed",
                       lambda: not record.exists(), agent)
        assert not is_alive(pid, started)
        assert "no longer exists: stopping its engine" in agent.log.read_text()


async def test_two_rank_replica_across_two_agents(shared_api_server, agents):
    """Rank 0 is probed over HTTP, rank 1 by being alive; when a worker dies, the head follows."""
    head, worker = agents("mn-1"), agents("mn-2")
    ports = ShardPorts(serve=free_port(), distInit=free_port())
    async with shared_api_server.client() as c:
        for rank, (_agent, node) in enumerate([(head, "mn-1"), (worker, "mn-2")]):
            await c.create(Shard(
                metadata=ObjectMeta(name=f"mn-r-{rank}"),
                spec=ShardSpec(replica="mn-r", model="m", node=node, rank=rank, worldSize=2, gpus=[0, 1],
                               ports=ports, headAddress="127.0.0.1", engine="sim", servedModelNames=["m"])))
        s0 = await shard_in(c, "mn-r-0", head, "Ready", "Failed")
        s1 = await shard_in(c, "mn-r-1", worker, "Ready", "Failed")
        assert (s0.status.phase, s1.status.phase) == ("Ready", "Ready"), (s0.status, s1.status)
        environ = Path(f"/proc/{s1.status.pid}/environ").read_bytes().split(b"\0")
        assert b"CUDA_VISIBLE_DEVICES=0,1" in environ

        os.kill(s1.status.pid, signal.SIGKILL)
        s1 = await shard_in(c, "mn-r-1", worker, "Failed")
        assert s1.status.exitCode == 137
        s0 = await shard_in(c, "mn-r-0", head, "Failed")
        assert s0.status.exitCode not in (None, 0)
        assert s0.status.logTail, "the head's last log lines are reported"


async def test_shard_gets_its_fabrics_adapters_as_nccl_ib_hca(shared_api_server, agents, tmp_path):
    ib = make_sysfs(tmp_path / "ib", [FakePort("mlx5_0", state="DOWN"), FakePort("mlx5_1"), FakePort("mlx5_2"),
                                      FakePort("mlx5_3")])
    agent = agents("fab-1", "--ib-root", str(ib), "--fabric", "ib-a", "--fabric", "ib-b:mlx5_1")
    async with shared_api_server.client() as c:
        await c.create(sim_shard("fab-1-a", "fab-1", fabric="ib-a"))
        await c.create(sim_shard("fab-1-x", "fab-1", fabric="ib-x"))
        shard = await shard_in(c, "fab-1-a", agent, "Ready", "Failed")
        assert shard.status.phase == "Ready", shard.status
        environ = Path(f"/proc/{shard.status.pid}/environ").read_bytes().split(b"\0")
        assert b"NCCL_IB_HCA==mlx5_2:1,mlx5_3:1" in environ
        wrong = await shard_in(c, "fab-1-x", agent, "Failed")
        assert wrong.status.message == "preflight: shard wants fabric ib-x, but this node's fabrics are: ib-a, ib-b"
        node = await c.get(Node, "fab-1")
        assert {f.name: [a.name for a in f.adapters] for f in node.status.fabrics} == {
            "ib-a": ["mlx5_2", "mlx5_3"], "ib-b": ["mlx5_1"]}


FAKE_VLLM = """#!{python}
# A stand-in for `vllm serve` (this machine has no vLLM): answers /health on --host/--port.
# Under Ray it first reaches its head at RAY_ADDRESS, as ray.init() does, and fails without it.
import http.server, os, socket, sys
argv = sys.argv[1:]
if "ray" in argv:
    head, _, head_port = os.environ["RAY_ADDRESS"].rpartition(":")
    socket.create_connection((head, int(head_port)), timeout=2).close()
host, port = argv[argv.index("--host") + 1], int(argv[argv.index("--port") + 1])
class Health(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200 if self.path == "/health" else 404)
        self.end_headers()
    def log_message(self, *a):
        pass
print("fake vllm serving", argv, flush=True)
http.server.HTTPServer((host, port), Health).serve_forever()
"""

FAKE_RAY = """#!{python}
# A stand-in for `ray start --block` (this machine has no Ray): a head listens on
# --port, a moment after it starts, as the GCS does.
import socket, sys, time
args = dict(a[2:].split("=", 1) for a in sys.argv[2:] if "=" in a)
print("fake ray", sys.argv[1:], flush=True)
if "--head" in sys.argv:
    time.sleep(1)
    server = socket.create_server((args["node-ip-address"], int(args["port"])))
time.sleep(600)
"""


def ray_node(agents, tmp_path, node: str, ray_program: str) -> tuple[AgentProcess, Shard]:
    """An agent with the stand-in vllm and the given stand-in ray, and a vLLM-under-Ray shard for it."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "vllm").write_text(FAKE_VLLM.format(python=sys.executable))
    (bin_dir / "ray").write_text(ray_program)
    for exe in ("vllm", "ray"):
        (bin_dir / exe).chmod(0o755)
    weights = tmp_path / "models" / "m"
    weights.mkdir(parents=True)
    agent = agents(node, "--engine", f"vllm={bin_dir / 'vllm'}", "--engine", f"ray={bin_dir / 'ray'}")
    shard = sim_shard(f"{node}-a", node, engine="vllm", source=str(weights))
    shard.spec.launchMode = "ray"
    return agent, shard


async def test_vllm_under_ray_runs_two_programs_that_live_and_die_together(shared_api_server, agents, tmp_path):
    agent, shard = ray_node(agents, tmp_path, "ray-1", FAKE_RAY.format(python=sys.executable))
    async with shared_api_server.client() as c:
        await c.create(shard)
        shard = await shard_in(c, "ray-1-a", agent, "Ready", "Failed")
        assert shard.status.phase == "Ready", shard.status
        record = json.loads((agent.state_dir / "shards" / "ray-1-a.json").read_text())
        procs = {p["name"]: p for p in record["processes"]}
        assert list(procs) == ["ray-head", "vllm"]
        assert shard.status.pid == procs["vllm"]["pid"]
        for p in procs.values():
            assert is_alive(p["pid"], p["start_time"]) and os.getpgid(p["pid"]) == p["pid"]
        node = await c.get(Node, "ray-1")
        assert {"vllm", "ray", "sim"} <= {e.name for e in node.status.engines}

        os.kill(procs["ray-head"]["pid"], signal.SIGKILL)
        shard = await shard_in(c, "ray-1-a", agent, "Failed")
        assert shard.status.exitCode == 137
        head_pid = procs['ray-head']['pid']
        assert shard.status.message.startswith(f"ray-head (pid {head_pid}) was killed by signal SIGKILL")
        assert "stopped vllm" in shard.status.message
        assert not is_alive(procs["vllm"]["pid"], procs["vllm"]["start_time"])


async def test_a_ray_head_that_dies_before_it_listens_fails_the_shard_before_vllm_starts(
        shared_api_server, agents, tmp_path):
    agent, shard = ray_node(agents, tmp_path, "ray-2",
                            "#!/bin/sh\necho 'Failed to start the GCS: address already in use'\nexit 1\n")
    async with shared_api_server.client() as c:
        await c.create(shard)
        shard = await shard_in(c, "ray-2-a", agent, "Failed")
    assert re.match(r"ray-head \(pid \d+\) exited with code 1 before it listened", shard.status.message)
    assert shard.status.exitCode == 1
    assert shard.status.logTail == ["Failed to start the GCS: address already in use"]
    assert "started vllm" not in agent.log.read_text()


async def test_a_shard_recreated_under_the_same_name_gets_a_new_engine(shared_api_server, agents):
    agent = agents("re-1")
    async with shared_api_server.client() as c:
        await c.create(sim_shard("re-1-a", "re-1"))
        old = await shard_in(c, "re-1-a", agent, "Ready", "Failed")
        assert old.status.phase == "Ready", old.status
        old_pid, old_started = old.status.pid, start_time(old.status.pid)
        await c.delete(Shard, "re-1-a")
        await c.create(sim_shard("re-1-a", "re-1"))

        async def new_engine_ready():
            s = await c.get(Shard, "re-1-a")
            return s if s.status.phase == "Ready" and s.status.pid != old_pid else None
        new = await wait_for("the new shard's own engine is Ready", new_engine_ready, agent)
        assert new.metadata.uid != old.metadata.uid
        assert not is_alive(old_pid, old_started)
        assert is_alive(new.status.pid)

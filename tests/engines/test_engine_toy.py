"""An engine added by writing one module and registering it (tests/fixtures/toy_engine.py): a Model may
name it, its reserved flags are refused, it is rendered, checked by `engine-check`, discovered by
the agent and checked by its preflight, and the scheduler places its replicas on a node whose agent
discovered it; no other file changed, and no module outside llmgw/engines/ names an engine."""
from __future__ import annotations

import ast
import os
from pathlib import Path

import pytest
from click.testing import CliRunner

from controllers.scheduler import SchedulerController
from llmgw.agent.config import AgentConfig
from llmgw.agent.facts import gather, node_status
from llmgw.agent.inventory import take_inventory
from llmgw.agent.preflight import PreflightError, prepare
from llmgw.api import Condition, InvalidObject, Node, ObjectMeta, Replica, parse_object
from llmgw.cli.main import cli
from llmgw.engines import NodeFacts, render
from llmgw.engines.check import widest_shards
from llmgw.engines.engine import ENGINES, register
from tests.fixtures.ctrlkit import replica, running
from tests.fixtures.poll import until

REPO = Path(__file__).resolve().parents[2]
FAKE_SMI = REPO / "hack" / "fakes" / "nvidia-smi"   # 8 GPUs

HELP = """usage: toy-server [--host HOST] [--port PORT] [--name NAME] [--weights PATH] [--help]

  --host HOST      address to listen on
  --port PORT      port to listen on
  --name NAME      the model's name
  --weights PATH   the weights
  --help           this text
"""


@pytest.fixture(autouse=True, scope="module")
def toy_registered():
    """The toy is registered while this module's tests run, and only then (it is imported here,
    not when the tests are collected): other modules see the built-in engines alone."""
    import tests.fixtures.toy_engine  # registers it, as importing an engine's module does

    register(tests.fixtures.toy_engine.ENGINE)   # again, if an earlier run of this fixture imported it
    yield
    ENGINES.pop("toy")


def model(args: list[str]) -> dict:
    return {"apiVersion": "llmgw.io/v1", "kind": "Model", "metadata": {"name": "toy-model"},
            "spec": {"source": "/models/toy", "profiles": [{"engine": "toy", "args": args}]}}


def test_a_model_names_the_engine_and_may_not_set_its_reserved_flags():
    assert parse_object(model(["--threads", "4"])).spec.profiles[0].engine == "toy"
    with pytest.raises(InvalidObject, match="engine toy loads no LoRA adapters"):
        parse_object({**model([]), "spec": {**model([])["spec"], "adapters": {"maxLoaded": 2}}})
    with pytest.raises(InvalidObject) as err:
        parse_object(model(["--name=other"]))
    assert err.value.problems == ["spec.profiles[0]: args may not set --name: llmgw passes the model's name "
                                  "and aliases so the gateway can route by them"]
    with pytest.raises(InvalidObject, match="engine toy is single-node"):
        parse_object(model([]) | {"spec": {"profiles": [{"engine": "toy", "nodes": 2}]}})


def test_it_is_rendered():
    [(shard, facts)] = widest_shards(ENGINES["toy"])   # single-node: one rank
    rendered = render(shard, NodeFacts("10.0.0.10"), {"toy-server": "/opt/toy/bin/toy-server"})
    [command] = rendered.commands
    assert command.argv == ["/opt/toy/bin/toy-server", "--host", "10.0.0.10", "--port", "30000",
                            "--name", "engine-check", "--weights", "/models/engine-check"]
    assert rendered.probe.url == "http://10.0.0.10:30000/health"


def test_engine_check_checks_its_flags():
    ok = CliRunner().invoke(cli, ["ctl", "engine-check", "toy", "--help-output", HELP])
    assert ok.exit_code == 0, ok.output
    assert "4 flags: 4 found, 0 missing, 0 skipped" in ok.output
    short = CliRunner().invoke(cli, ["ctl", "engine-check", "toy", "--help-output", HELP.replace("--weights", "--w")])
    assert short.exit_code == 1 and "4 flags: 3 found, 1 missing, 0 skipped" in short.output


@pytest.fixture
def toy_server(tmp_path) -> str:
    exe = tmp_path / "toy-server"
    exe.write_text("#!/bin/sh\necho 'version: 1.2.3'\n")
    os.chmod(exe, 0o755)
    return str(exe)


def agent_config(tmp_path, name: str, engines: dict[str, str]) -> AgentConfig:
    """An agent's configuration on a machine with 8 (fake) GPUs and no InfiniBand."""
    return AgentConfig.model_validate({
        "node": name, "server": "https://s:7443", "engines": engines, "nvidia_smi": str(FAKE_SMI),
        "ib_root": str(tmp_path / "no-infiniband"), "advertise_address": "10.0.0.10"})


def test_the_agent_discovers_it(tmp_path, toy_server):
    config = agent_config(tmp_path, "n1", {"toy": toy_server})
    assert config.engines == {"toy-server": toy_server}   # an engine's name stands for its program
    found = {e.name: e for e in take_inventory(config.engines).engines}
    assert found["toy"].path == toy_server and found["toy"].version == "1.2.3"


def test_the_agents_preflight_checks_its_program_and_weights(tmp_path, toy_server):
    [(shard, _)] = widest_shards(ENGINES["toy"])
    weights = tmp_path / "weights"
    shard.spec.source = str(weights)
    with pytest.raises(PreflightError, match="executable file not found: toy-server"):
        prepare(shard, gather(agent_config(tmp_path, "n1", {})))   # not given: looked for on PATH
    facts = gather(agent_config(tmp_path, "n1", {"toy": toy_server}))
    with pytest.raises(PreflightError, match=f"model weights not found: {weights}"):
        prepare(shard, facts)                                      # the toy loads weights
    weights.mkdir()
    assert prepare(shard, facts).commands[0].argv[0] == toy_server


async def test_the_scheduler_places_it_on_a_node_whose_agent_discovered_it(store, tmp_path, toy_server):
    for name, engines in (("plain", {}), ("toys", {"toy": toy_server})):
        config = agent_config(tmp_path, name, engines)
        ready = [Condition(type="Ready", status="True", reason="Heartbeat")]
        await store.create(Node(metadata=ObjectMeta(name=name), status=node_status(gather(config), config, ready)))
    toy = replica("toy-0", "toy-model")
    toy.spec.profile = toy.spec.profile.model_copy(update={"engine": "toy"})
    async with running(store, [SchedulerController()]):
        await store.create(toy)
        placed = await until(lambda: _placed(store, "toy-0"))
    assert [p.node for p in placed.spec.placement] == ["toys"]


async def _placed(store, name: str) -> Replica | None:
    r = await store.get(Replica, name)
    return r if r.spec.placement else None


# The `llmgw sim` command is named "sim" too: a command's name, not a switch on the engine.
COMMAND_NAMES = {("llmgw", "cli", "main.py"), ("llmgw", "cmd", "sim.py")}


def test_no_module_outside_the_engines_names_an_engine():
    """What llmgw knows of an engine is in its module: no other module holds an engine's, a
    program's or a launch mode's name as a string (a comparison, a default, a table key)."""
    words = {w for e in ENGINES.values()
             for w in (e.name, *e.launch_modes, *(x.name for x in e.executables),
                       *(x.reports for x in e.executables))}
    found = []
    for path in sorted([*(REPO / "llmgw").rglob("*.py"), *(REPO / "controllers").rglob("*.py")]):
        rel = path.relative_to(REPO).parts
        if rel[:2] in (("llmgw", "engines"), ("llmgw", "sim")) or rel in COMMAND_NAMES:
            continue
        for n in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(n, ast.Constant) and n.value in words:
                found.append(f"{'/'.join(rel)}:{n.lineno}: {n.value!r}")
    assert found == []

"""An engine added by writing one module and registering it (tests/toy_engine.py): a Model may
name it, its reserved flags are refused, it is rendered, checked by `engine-check`, discovered by
the agent, and the scheduler places its replicas where a node reports it; no other file changed."""
from __future__ import annotations

import os

import pytest
from click.testing import CliRunner

from controllers.scheduler import SchedulerController
from llmgw.agent.config import AgentConfig
from llmgw.agent.inventory import take_inventory
from llmgw.api import InvalidObject, Replica, parse_object
from llmgw.cli.main import cli
from llmgw.engines import NodeFacts, render
from llmgw.engines.check import widest_shards
from llmgw.engines.engine import ENGINES, register
from tests.helpers.ctrlkit import node, replica, running
from tests.helpers.poll import until

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
    import tests.toy_engine  # registers it, as importing an engine's module does

    register(tests.toy_engine.ENGINE)   # again, if an earlier run of this fixture imported it
    yield
    ENGINES.pop("toy")


def model(args: list[str]) -> dict:
    return {"apiVersion": "llmgw.io/v1", "kind": "Model", "metadata": {"name": "toy-model"},
            "spec": {"source": "/models/toy", "profiles": [{"engine": "toy", "args": args}]}}


def test_a_model_names_the_engine_and_may_not_set_its_reserved_flags():
    assert parse_object(model(["--threads", "4"])).spec.profiles[0].engine == "toy"
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


def test_the_agent_discovers_it(tmp_path):
    exe = tmp_path / "toy-server"
    exe.write_text("#!/bin/sh\necho 'version: 1.2.3'\n")
    os.chmod(exe, 0o755)
    config = AgentConfig.model_validate({"node": "n1", "server": "https://s:7443", "engines": {"toy": str(exe)}})
    assert config.engines == {"toy-server": str(exe)}   # an engine's name stands for its program
    found = {e.name: e for e in take_inventory(config.engines).engines}
    assert found["toy"].path == str(exe) and found["toy"].version == "1.2.3"


async def test_the_scheduler_places_it_where_a_node_reports_it(store):
    await store.create(node("plain"))                          # reports only the sim
    await store.create(node("toys", engines=("sim", "toy")))
    toy = replica("toy-0", "toy-model")
    toy.spec.profile = toy.spec.profile.model_copy(update={"engine": "toy"})
    async with running(store, [SchedulerController()]):
        await store.create(toy)
        placed = await until(lambda: _placed(store, "toy-0"))
    assert [p.node for p in placed.spec.placement] == ["toys"]


async def _placed(store, name: str) -> Replica | None:
    r = await store.get(Replica, name)
    return r if r.spec.placement else None

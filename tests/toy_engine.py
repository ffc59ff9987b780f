"""A toy engine, written as a new one is (docs/architecture.md, "Adding an engine"): one module that
renders a shard and declares what llmgw knows of the engine. tests/test_engine_toy.py uses it.

toy-server: single node, one program that listens where it is told and answers to one name.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from llmgw.engines.base import Command, NodeFacts, RenderedShard, base_env, health_probe, program, weights
from llmgw.engines.engine import HOST, MODEL, NAME, PORT, Engine, Executable, HelpCommand, register
from llmgw.engines.helptext import used_flags

if TYPE_CHECKING:
    from llmgw.api import Shard


def render(shard: Shard, node: NodeFacts, executables: dict[str, str]) -> RenderedShard:
    spec = shard.spec
    argv = [program(executables, "toy-server"), "--host", node.address, "--port", str(spec.ports.serve),
            "--name", spec.servedModelNames[0], "--weights", weights(shard), *spec.args]
    return RenderedShard([Command("toy-server", argv, base_env(shard, node), serves=True)],
                         health_probe(node, spec.ports.serve))


def _help(command: Command) -> HelpCommand | None:
    if command.name != "toy-server":
        return None
    return HelpCommand("toy-server", [command.argv[0], "--help"], flags=used_flags(command.argv[1:]))


ENGINE = register(Engine(
    name="toy", render=render, help_of=_help,
    executables=(Executable("toy-server", "toy", version_argv=("--version",)),),
    reserved={"--host": HOST, "--port": PORT, "--name": NAME, "--weights": MODEL},
    multi_node=False,
))

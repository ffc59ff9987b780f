"""Checks before a shard's engine starts; each failure names the path or field at fault.

Render the shard for this node, then check every program it would run, the
model's weights and the GPUs it was given (where its engine declares it loads
weights and uses GPUs: not the sim).
"""
from __future__ import annotations

import os
import shutil

from llmgw.agent.facts import Facts
from llmgw.agent.inventory import check_executable
from llmgw.api import Shard
from llmgw.engines import NodeFacts, RenderedShard, RenderError, lookup, render


class PreflightError(Exception):
    pass


def prepare(shard: Shard, facts: Facts, loras: list[str] | None = None) -> RenderedShard:
    """The rendered commands of `shard` on this node (given the weights of `loras`, where its engine
    takes adapters at start), or PreflightError saying why not."""
    spec = shard.spec
    adapters: list[tuple[str, int]] = []
    if spec.fabric:
        try:
            adapters = facts.fabrics.adapters(spec.fabric)
        except KeyError:
            mine = ", ".join(f.name for f in facts.fabrics.fabrics) or "none (an island)"
            raise PreflightError(f"shard wants fabric {spec.fabric}, but this node's fabrics are: {mine}") from None
    try:
        rendered = render(shard, NodeFacts(facts.address, adapters, loras or []), facts.inventory.executables())
    except RenderError as err:
        raise PreflightError(str(err)) from None
    for cmd in rendered.commands:
        problem = _executable_problem(cmd.argv[0], cmd.env)
        if problem:
            raise PreflightError(problem)
    engine = lookup(spec.engine)   # render found it
    if engine.loads_weights and spec.source and not os.path.exists(spec.source):
        raise PreflightError(f"model weights not found: {spec.source} (spec.source of model {spec.model})")
    if engine.uses_gpus:
        _check_gpus(shard, facts)
    return rendered


def _executable_problem(program: str, env: dict[str, str]) -> str | None:
    if os.sep in program:
        return check_executable(program)
    path = env.get("PATH", os.environ.get("PATH", os.defpath))
    if shutil.which(program, path=path) is None:
        return f"executable file not found: {program} (not on PATH {path})"
    return None


def _check_gpus(shard: Shard, facts: Facts) -> None:
    if not shard.spec.gpus:
        return
    if not facts.gpu.ok:
        raise PreflightError(f"shard needs GPUs {shard.spec.gpus}, but GPU discovery failed: {facts.gpu.error}")
    have = {g.index for g in facts.gpu.gpus}
    missing = sorted(set(shard.spec.gpus) - have)
    if missing:
        raise PreflightError(f"shard needs GPUs {missing}, which this node does not have "
                             f"(it has {sorted(have)})")

"""`engine-check`: render the widest shards llmgw would produce and check every flag against its program's help.

Each command a renderer emits goes to one program (ray, vllm, sglang's
launch_server, llama-server, the sim). That program's --help is read in full
(vLLM's with --help=all and VLLM_TARGET_DEVICE=cpu, so it answers on a machine
without accelerators) and every flag the command uses must appear on one of its
option lines. A program that cannot be run is skipped, not failed, unless it is
the one `--executable` named: a path that is not there fails the check.
"""
from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass, field
from typing import Literal

from llmgw.api import AdapterSlots, KVBudget, ObjectMeta, Shard, ShardPorts, ShardSpec
from llmgw.engines import render
from llmgw.engines.base import Command, NodeFacts
from llmgw.engines.engine import Engine, HelpCommand, lookup
from llmgw.engines.helptext import documented_flags, is_documented

HELP_TIMEOUT = 300.0  # vLLM imports torch before it prints its help

Status = Literal["found", "missing", "skipped"]


@dataclass(frozen=True)
class FlagResult:
    program: str
    flag: str
    status: Status
    note: str = ""


@dataclass
class Report:
    results: list[FlagResult] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    def count(self, status: Status) -> int:
        return sum(1 for r in self.results if r.status == status)

    @property
    def failed(self) -> bool:
        return self.count("missing") > 0 or bool(self.errors)


# --------------------------------------------------------------- widest shards

def widest_shards(engine: Engine, launch_mode: str | None = None, world: int | None = None) \
        -> list[tuple[Shard, NodeFacts]]:
    """Every rank of the widest replica llmgw renders for the engine: 2 nodes on a fabric (1 if single-node),
    or `world` nodes."""
    world = world or (2 if engine.multi_node else 1)
    out = []
    for rank in range(world):
        spec = ShardSpec(
            replica="engine-check", model="engine-check", node=f"node-{rank}", rank=rank, worldSize=world,
            gpus=[0, 1], headAddress="10.0.0.10",
            # rank 0 publishes KV events where the engine does (a precise-prefix Model)
            ports=ShardPorts(serve=30000, distInit=30001, kvEvents=30002, kvReplay=30003)
            if engine.kv_events and rank == 0 else ShardPorts(serve=30000, distInit=30001),
            fabric="fabric-a" if world > 1 else None, engine=engine.name,
            launchMode=launch_mode if engine.launch_modes else None, gpusPerNode=2,
            source="/models/engine-check", servedModelNames=["engine-check", "engine-check-alias"],
            # a KV budget, as the scheduler gives a replica of an estimated model: its flags are checked
            kvCache=KVBudget(gpuMiB=81559, freeMiB=81556, bytes=60 << 30, tokens=491520),
            # LoRA slots where the engine takes adapters (a Model's spec.adapters): their flags too
            adapters=AdapterSlots(maxLoaded=4) if engine.lora else None,
        )
        adapters = [("mlx5_0", 1), ("mlx5_1", 1)] if world > 1 else []
        # the adapters an engine that takes them only at start is given (llama-server's --lora)
        loras = ["/cache/engine-check-lora-a.gguf", "/cache/engine-check-lora-b.gguf"] if engine.lora else []
        out.append((Shard(metadata=ObjectMeta(name=f"engine-check-{rank}"), spec=spec),
                    NodeFacts(address=f"10.0.0.{10 + rank}", fabric_adapters=adapters, loras=loras)))
    return out


def main_program(engine: Engine) -> str:
    """The executables key a --executable path fills: the engine's main program (the sim: llmgw)."""
    return engine.executables[0].name if engine.executables else "llmgw"


def executables_for(engine: Engine, executable: str | None) -> dict[str, str]:
    """--executable names the engine's main program; its others (vLLM's ray) are looked for next to
    it, then on PATH."""
    if not executable:
        return {}
    paths = {main_program(engine): executable}
    for other in engine.executables[1:]:
        sibling = os.path.join(os.path.dirname(executable), other.name)
        if os.path.dirname(executable) and os.access(sibling, os.X_OK):
            paths[other.name] = sibling
    return paths


# ------------------------------------------------------------ programs

def program_of(engine: Engine, command: Command) -> HelpCommand:
    """Which program a command runs, how to ask for its help, and the flags it is given."""
    prog = engine.help_of(command)
    if prog is None:
        raise ValueError(f"engine-check does not know the program of command {command.name!r}")
    return prog


def programs(engine: Engine, launch_mode: str | None, executables: dict[str, str]) -> list[HelpCommand]:
    """The programs of every rank's commands, with the union of their flags, in first-seen order: the
    widest replica's, then a one-node replica's (a flag only those are given: SGLang's --page-size)."""
    merged: dict[str, HelpCommand] = {}
    shards = widest_shards(engine, launch_mode)
    if len(shards) > 1:
        shards += widest_shards(engine, launch_mode, world=1)
    for shard, node in shards:
        for command in render(shard, node, executables).commands:
            prog = program_of(engine, command)
            if prog.name in merged:
                known = merged[prog.name].flags
                known += [f for f in prog.flags if f not in known]
            else:
                merged[prog.name] = prog
    return list(merged.values())


# ---------------------------------------------------------------- help

@dataclass
class Help:
    text: str | None  # None: could not be obtained
    reason: str = ""  # why not, or a caveat
    unrunnable: bool = False  # the program is not there or cannot be executed at all


def run_help(prog: HelpCommand, timeout: float = HELP_TIMEOUT) -> Help:
    """The program's help; when that fails and the program has an older way to ask, that one's."""
    got = _run_help(prog.help_argv, prog.help_env, timeout)
    if got.text is not None or not prog.fallback_help_argv or got.unrunnable:
        return got
    older = _run_help(prog.fallback_help_argv, prog.help_env, timeout)
    if older.text is None:
        return got
    return Help(older.text, f"{got.reason}; checked against `{' '.join(prog.fallback_help_argv)}` instead")


def _run_help(argv: list[str], env: dict[str, str], timeout: float) -> Help:
    """Run a help command and read all of it (stdout and stderr)."""
    command = " ".join(argv)
    try:
        done = subprocess.run(
            argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            env={**os.environ, **env}, timeout=timeout,
        )
    except FileNotFoundError:
        return Help(None, f"not installed: {argv[0]} not found", unrunnable=True)
    except PermissionError:
        return Help(None, f"cannot run {argv[0]}: not executable", unrunnable=True)
    except subprocess.TimeoutExpired:
        return Help(None, f"`{command}` did not finish within {timeout:g} s")
    except OSError as e:
        return Help(None, f"cannot run {argv[0]}: {e}", unrunnable=True)
    text = done.stdout.decode(errors="replace")
    if done.returncode != 0:
        if not documented_flags(text):
            last = text.strip().splitlines()[-1] if text.strip() else "no output"
            return Help(None, f"`{command}` exited with status {done.returncode}: {last}")
        return Help(text, f"`{command}` exited with status {done.returncode}")
    return Help(text)


# --------------------------------------------------------------- check

def check(name: str, launch_mode: str | None = None, executable: str | None = None,
          help_text: str | None = None, timeout: float = HELP_TIMEOUT) -> Report:
    """Check every flag of the widest render of engine `name`; `help_text` stands in for its main
    program's help."""
    report = Report()
    engine = lookup(name)
    # the main program as its help names it (the sim's is itself: `llmgw sim`)
    main = engine.executables[0].name if engine.executables else engine.name
    for prog in programs(engine, launch_mode, executables_for(engine, executable)):
        if help_text is not None and prog.name == main:
            got = Help(help_text)
        else:
            got = run_help(prog, timeout)
        if got.text is None and got.unrunnable and executable and prog.name == main:
            report.errors.append(f"{prog.name}: --executable {executable}: {got.reason}")
        if got.text is None:
            report.results += [FlagResult(prog.name, f, "skipped", got.reason) for f in prog.flags]
            report.warnings.append(f"{prog.name}: skipped, {got.reason}")
            continue
        if got.reason:
            report.warnings.append(f"{prog.name}: {got.reason}")
        documented = documented_flags(got.text)
        if "--help" not in documented:
            report.warnings.append(
                f"{prog.name}: the help text does not document --help itself: it may be truncated, "
                "or not a help text at all")
        for flag in prog.flags:
            status: Status = "found" if is_documented(flag, documented) else "missing"
            report.results.append(FlagResult(prog.name, flag, status))
        missing = [r for r in report.results if r.program == prog.name and r.status == "missing"]
        if missing and "--help=" in got.text:
            report.warnings.append(
                f"{prog.name}: this help points to --help=...: it is a summary (vLLM >= 0.11 lists every "
                "flag only under `vllm serve --help=all`); check against the full listing")
    return report

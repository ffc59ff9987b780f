"""`llmgw ctl`: operator tools. `engine-check` checks llmgw's engine command lines against the engines' help;
`snapshot` saves, inspects and restores etcd's snapshots (llmgw/cmd/snapshot.py); `migrate-storage` rewrites
the stored objects in the current storage version (llmgw/cmd/migrate.py); `fit` estimates a Model's GPU memory
per GPU from its files (llmgw/fit.py)."""
from __future__ import annotations

import sys
from typing import IO

import click
from rich import box
from rich.console import Console
from rich.table import Table

from llmgw.engines.engine import ENGINES

STYLE = {"found": "green", "missing": "bold red", "skipped": "yellow"}


class EngineName(click.ParamType[str]):
    """A registered engine's name, read from the registry when the command runs (not at import)."""

    name = "engine"

    def convert(self, value: str, param: click.Parameter | None, ctx: click.Context | None) -> str:
        if value not in ENGINES:
            self.fail(f"{value!r} is not an engine: one of {', '.join(sorted(ENGINES))}", param, ctx)
        return value

    def get_metavar(self, param: click.Parameter, ctx: click.Context | None = None) -> str:
        return "{" + "|".join(sorted(ENGINES)) + "}"


class CtlGroup(click.Group):
    """ctl's commands, and those of the composition roots (llmgw/cmd/) it names, imported on use as
    `llmgw`'s are (llmgw.cli.main.COMMANDS): `snapshot` and `migrate-storage` talk to etcd, which the CLI may not."""

    ROOTS = {"snapshot": "llmgw.cmd.snapshot:snapshot", "migrate-storage": "llmgw.cmd.migrate:migrate_storage"}

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(set(super().list_commands(ctx)) | set(self.ROOTS))

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        from llmgw.cli.main import load

        return load(self.ROOTS[name]) if name in self.ROOTS else super().get_command(ctx, name)


@click.group("ctl", cls=CtlGroup)
def ctl() -> None:
    """Operator tools."""


@ctl.command("engine-check")
@click.argument("engine", type=EngineName())
@click.option("--launch-mode", help="The engine's multi-node launcher, where it has several (vLLM: mp, the "
                                    "default, or ray).")
@click.option("--executable", metavar="PATH",
              help="The engine's program (vllm, the Python with SGLang, llama-server, llmgw); "
                   "default: found on PATH. For vLLM under Ray, ray is looked for next to it first.")
@click.option("--help-output", metavar="TEXT", help="Check against this help text instead of running the engine.")
@click.option("--help-file", type=click.File("r"), help="Check against the help text in this file.")
@click.option("--timeout", type=float, default=300.0, show_default=True,
              help="Seconds each program gets to print its help.")
def engine_check(engine: str, launch_mode: str | None, executable: str | None, help_output: str | None,
                 help_file: IO[str] | None, timeout: float) -> None:
    """Check every flag llmgw passes to ENGINE's programs against their own --help.

    Renders the widest command lines llmgw produces (a 2-node replica, with
    LoRA adapter slots and KV events, and a 1-node one) and looks every flag up
    in the help of the program that receives it: ray's in `ray start --help`,
    vLLM's in `vllm serve --help=all`. A program that
    cannot be run is skipped, except the one --executable names. Exits 1 when a
    flag is missing or the --executable path cannot be run.
    """
    from llmgw.engines.check import check  # the renderers pull in the API types

    modes = ENGINES[engine].launch_modes
    if launch_mode and launch_mode not in modes:
        raise click.UsageError(f"--launch-mode {launch_mode}: engine {engine} has "
                               + (f"the launch modes {', '.join(modes)}" if modes else "no launch modes"))
    if help_output is not None and help_file is not None:
        raise click.UsageError("give --help-output or --help-file, not both")
    help_text = help_file.read() if help_file is not None else help_output
    report = check(engine, launch_mode, executable, help_text, timeout)

    console = Console(width=None if sys.stdout.isatty() else 120, highlight=False)
    table = Table(box=box.SIMPLE, title=f"engine-check {engine}" + (f" ({launch_mode})" if launch_mode else ""))
    for column in ("program", "flag", "result", "note"):
        table.add_column(column, overflow="fold")
    for r in report.results:
        table.add_row(r.program, r.flag, f"[{STYLE[r.status]}]{r.status}[/]", r.note)
    console.print(table)
    for warning in report.warnings:
        click.echo(f"warning: {warning}", err=True)
    for error in report.errors:
        click.echo(f"error: {error}", err=True)
    summary = ", ".join(f"{report.count(s)} {s}" for s in ("found", "missing", "skipped"))
    click.echo(f"{len(report.results)} flags: {summary}")
    if report.failed:
        sys.exit(1)


# --------------------------------------------------------- nodes and drains
# The same code as `llmgw get nodes` and `llmgw drain` (llmgw/cli/get.py, nodes.py).

def _nodes_command() -> click.Command:
    from llmgw.api import Node
    from llmgw.cli.connect import Connection, connection_options
    from llmgw.cli.errors import EXIT_CODES_HELP
    from llmgw.cli.get import get_options, run_get

    @click.command("nodes", epilog=EXIT_CODES_HELP)
    @get_options
    @connection_options
    def nodes(output: str | None, selector: str | None, watch: bool, conn: Connection) -> None:
        """The node table of `llmgw get nodes`: status, GPUs used/total, fabrics, engines, replicas."""
        run_get(conn, Node, None, output, selector, watch)

    return nodes


def _drain_command() -> click.Command:
    from llmgw.cli.nodes import drain_command

    return drain_command("drain")


def _weights_command() -> click.Command:
    from llmgw.api import Model, Node, Shard
    from llmgw.api.kinds import all_of_kind
    from llmgw.cli.connect import Connection, connection_options, run
    from llmgw.cli.errors import EXIT_CODES_HELP
    from llmgw.printers.table import Row, print_table
    from llmgw.printers.weights import HEADERS, weights_rows

    async def rows(conn: Connection) -> list[Row]:
        async with conn.client() as c:
            nodes = all_of_kind(Node, (await c.list(Node))[0])
            models = all_of_kind(Model, (await c.list(Model))[0])
            shards = all_of_kind(Shard, (await c.list(Shard))[0])
        return weights_rows(nodes, models, shards)

    @click.command("weights", epilog=EXIT_CODES_HELP)
    @connection_options
    def weights(conn: Connection) -> None:
        """Which nodes' caches hold which weights (by content digest), for which models, the shards
        using each copy (an unused one may be evicted), and each cache's free space and capacity."""
        print_table(HEADERS, run(rows(conn)))

    return weights


FIT_HEADERS = ["MODEL", "PROFILE", "ENGINE", "TP", "PP", "WEIGHTS", "OVERHEAD", "KV/TOKEN", "NEEDED"]


def _gpu(ctx: click.Context, param: click.Parameter, values: tuple[str, ...]) -> list[tuple[str, float]]:
    """--gpu NAME:GIB, each: (NAME, GiB)."""
    gpus = []
    for value in values:
        name, _, memory = value.rpartition(":")
        try:
            gib = float(memory)
        except ValueError:
            gib = 0.0
        if not name or gib <= 0:
            raise click.BadParameter(f"{value!r} is not NAME:GIB (say H100:80)", ctx, param)
        gpus.append((name, gib))
    return gpus


@ctl.command("fit")
@click.option("-f", "--filename", "files", multiple=True, required=True, metavar="FILE",
              help="Model manifests (a file or a directory), as `llmgw apply -f` takes them.")
@click.option("--gpu", "gpus", multiple=True, callback=_gpu, metavar="NAME:GIB",
              help="A GPU to work out the context for, its memory in GiB (H100:80); a column each, "
                   "'-' where it cannot hold NEEDED. Repeatable.")
@click.option("--gpu-memory", type=click.FloatRange(min=0, min_open=True), default=80.0, show_default=True,
              metavar="GIB", help="Without --gpu: the GPU memory CONTEXT is worked out for, in GiB.")
@click.option("--tp", type=click.IntRange(min=1), metavar="N",
              help="Each profile at tensor parallel N (its pipeline stages kept), not its own split.")
def fit(files: tuple[str, ...], gpus: list[tuple[str, float]], gpu_memory: float, tp: int | None) -> None:
    """Each profile of each Model in the files: per GPU, its weights, the engine's overhead, the KV
    bytes per token (full-attention layers, plus sliding-window layers' up to their window; the
    profile's --kv-cache-dtype counted), what placement needs free (weights, overhead and the KV
    cache of 4,096 tokens, or of the Model's spec.minContext or its engine's context flag in the
    args, --max-model-len), and the tokens of context a GPU of --gpu-memory GiB (or of each --gpu)
    holds. Read from the model's files: a local spec.source (safetensors headers and config.json,
    or a GGUF file's metadata), or an hf:// or http(s):// source by HTTP Range reads of those alone,
    before any pull (the hub at HF_ENDPOINT, with HF_TOKEN); no cluster is asked."""
    from llmgw.api import Model
    from llmgw.cli.apply import load_manifests
    from llmgw.cli.connect import checked
    from llmgw.cli.errors import CliError
    from llmgw.fit import GiB, ShapeError, gib, profile_estimate
    from llmgw.fitremote import read_source
    from llmgw.printers.table import print_table

    models = [o for o in checked(lambda: load_manifests(files, False)) if isinstance(o, Model)]
    if not models:
        raise CliError(f"{', '.join(files)}: no Model")
    columns = gpus or [("CONTEXT", gpu_memory)]
    rows = []
    for m in models:
        if m.spec.source is None:
            raise CliError(f"model {m.name}: no spec.source to read")
        try:
            shape = read_source(m.spec.source)
            for i, p in enumerate(m.spec.profiles):
                est = profile_estimate(shape, m.spec, i, tp)
                contexts = [str(est.context(int(memory * GiB))) if not gpus or est.needed <= memory * GiB else "-"
                            for _, memory in columns]
                rows.append([m.name, str(i), p.engine, str(est.tp), str(est.pp), gib(est.weights), gib(est.overhead),
                             est.kv_text(), gib(est.needed), *contexts])
        except ShapeError as err:
            raise CliError(f"model {m.name}: {err}") from None
    print_table(FIT_HEADERS + [name for name, _ in columns], rows)


ctl.add_command(_nodes_command())
ctl.add_command(_drain_command())
ctl.add_command(_weights_command())

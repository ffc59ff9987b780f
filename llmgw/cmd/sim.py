"""`llmgw sim ...`: the click entry point; the options themselves are argparse's (see config.py)."""
from __future__ import annotations

import asyncio
import sys

import click

from llmgw.sim.config import parse


def run_sim(argv: list[str]) -> int:
    cfg = parse(argv)  # exits 2 with a usage message on bad options, 0 on --help
    from llmgw.sim.engine import run  # aiohttp is imported only when the engine really starts
    return asyncio.run(run(cfg))


@click.command(
    "sim",
    add_help_option=False,
    context_settings={"ignore_unknown_options": True, "allow_extra_args": True},
)
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
def sim(args: tuple[str, ...]) -> None:
    """Run the simulated engine (`llmgw sim --help` lists its options)."""
    sys.exit(run_sim(list(args)))


def main() -> None:
    sys.exit(run_sim(sys.argv[1:]))

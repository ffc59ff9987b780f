"""Plugins, as kubectl's: an executable `llmgw-NAME` on PATH runs as `llmgw NAME ARGS...`.

`llmgw NAME` that is no built-in command replaces itself with the first `llmgw-NAME` on PATH
(exec: the plugin's exit status is llmgw's, its stdin, stdout and stderr are the terminal's).
A built-in command cannot be replaced; `llmgw plugin list` says which files are shadowed.
"""
from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from pathlib import Path

import click

from llmgw.cli.errors import ERROR, CliError

PREFIX = "llmgw-"


@dataclass(frozen=True)
class Plugin:
    name: str   # the command: `llmgw NAME`
    path: Path


def candidates() -> list[Plugin]:
    """Every file named llmgw-* in PATH's folders, in PATH's order (the first of a name wins)."""
    found = []
    for folder in os.environ.get("PATH", "").split(os.pathsep):
        try:
            entries = sorted(Path(folder or ".").iterdir())
        except OSError:
            continue
        found += [Plugin(p.name[len(PREFIX):], p) for p in entries
                  if p.name.startswith(PREFIX) and len(p.name) > len(PREFIX) and p.is_file()]
    return found


def executable(path: Path) -> bool:
    return os.access(path, os.X_OK)


def find(name: str) -> Plugin | None:
    """The plugin `llmgw NAME` runs: the first executable llmgw-NAME on PATH."""
    return next((p for p in candidates() if p.name == name and executable(p.path)), None)


def command(plugin: Plugin) -> click.Command:
    """A command that hands every argument to the plugin, --help included."""
    @click.command(plugin.name, add_help_option=False, help=f"Plugin {plugin.path}.",
                   context_settings={"ignore_unknown_options": True, "allow_extra_args": True})
    @click.argument("args", nargs=-1, type=click.UNPROCESSED)
    def run(args: tuple[str, ...]) -> None:
        sys.stdout.flush()
        sys.stderr.flush()
        try:
            os.execv(plugin.path, [str(plugin.path), *args])
        except OSError as err:
            raise CliError(f"plugin {plugin.path}: cannot run: {err.strerror or err}", ERROR) from None

    return run


@click.group()
def plugin() -> None:
    """Plugins: executables named llmgw-NAME on PATH, run as `llmgw NAME ARGS...`."""


@plugin.command("list")
@click.pass_context
def list_plugins(ctx: click.Context) -> None:
    """The plugins on PATH, in the order PATH finds them, and a warning for each one that cannot
    run as its name says: not executable, shadowed by a built-in command or by an earlier file."""
    group = ctx.find_root().command
    builtins = set(group.list_commands(ctx)) if isinstance(group, click.Group) else set()
    found = candidates()
    if not found:
        raise CliError("no plugins on PATH (executables named llmgw-NAME)", ERROR)
    first: dict[str, Path] = {}
    for p in found:
        click.echo(str(p.path))
        if not executable(p.path):
            click.echo(f"  warning: {p.path} is not executable", err=True)
        elif p.name in builtins:
            click.echo(f"  warning: {p.path} is shadowed by the built-in command `llmgw {p.name}`", err=True)
        elif p.name in first:
            click.echo(f"  warning: {p.path} is shadowed by {first[p.name]}", err=True)
        else:
            first[p.name] = p.path

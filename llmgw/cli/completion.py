"""Shell completion: `llmgw completion bash|zsh|fish` prints the script, and the callbacks that
complete kinds and object names (listed through the client, connected as the command line's
--config/--context say: llmgw/cli/connect.py, which completes the context names itself).

click does the protocol: the script calls `llmgw` with _LLMGW_COMPLETE=bash_complete (or
zsh_complete, fish_complete) and the words so far (COMP_WORDS, COMP_CWORD), and click asks the
argument or option under the cursor for its candidates. A callback that cannot reach the server
or read the config offers nothing: a Tab key must never print an error into the command line.
"""
from __future__ import annotations

import asyncio
from typing import Any

import click
from click.shell_completion import CompletionItem, get_completion_class

COMPLETE_VAR = "_LLMGW_COMPLETE"
SHELLS = ("bash", "zsh", "fish")
LIST_TIMEOUT = 3.0  # seconds for the server to answer a completion's list: a Tab key waits on it


def complete_kind(ctx: click.Context, param: click.Parameter, incomplete: str) -> list[CompletionItem]:
    from llmgw.api import KINDS

    return [CompletionItem(k) for k in KINDS if k.startswith(incomplete.lower())]


def complete_name(ctx: click.Context, param: click.Parameter, incomplete: str) -> list[CompletionItem]:
    """The names of objects of the KIND argument before it, from the cluster."""
    return _names(ctx, ctx.params.get("kind"), incomplete)


def complete_kind_slash_name(ctx: click.Context, param: click.Parameter,
                             incomplete: str) -> list[CompletionItem]:
    """KIND[/NAME] (events --for): kinds, then KIND/ and the names of that kind from the cluster."""
    kind, sep, rest = incomplete.partition("/")
    if not sep:
        return [CompletionItem(k.value + "/") for k in complete_kind(ctx, param, incomplete)]
    return [CompletionItem(f"{kind}/{i.value}") for i in _names(ctx, kind, rest)]


def complete_log_target(ctx: click.Context, param: click.Parameter, incomplete: str) -> list[CompletionItem]:
    """REPLICA|SHARD (logs): replicas' names, or replica/NAME and shard/NAME."""
    kind, sep, rest = incomplete.partition("/")
    if sep and kind in ("replica", "shard"):
        return [CompletionItem(f"{kind}/{i.value}") for i in _names(ctx, kind, rest)]
    return _names(ctx, "replicas", incomplete)


def complete_node(ctx: click.Context, param: click.Parameter, incomplete: str) -> list[CompletionItem]:
    return _names(ctx, "nodes", incomplete)


def _names(ctx: click.Context, kind: Any, incomplete: str) -> list[CompletionItem]:
    if not isinstance(kind, str):
        return []
    try:
        names = asyncio.run(_list_names(ctx.params, kind))
    except Exception:  # noqa: BLE001 - unknown kind, no config, server down, refused: nothing to offer
        return []
    return [CompletionItem(n) for n in sorted(names) if n.startswith(incomplete)]


async def _list_names(params: dict[str, Any], kind: str) -> list[str]:
    from llmgw.api.kinds import kind_named
    from llmgw.cli.connect import Connection
    from llmgw.client import Client

    conn = Connection(**{k: params.get(k) for k in ("config", "server", "ca", "cert", "key", "context")})
    async with Client.from_config(conn.client_config(), timeout=LIST_TIMEOUT, oneshot=True) as c:
        items, _ = await c.list(kind_named(kind))
    return [o.name for o in items]


@click.command()
@click.argument("shell", type=click.Choice(SHELLS))
@click.pass_context
def completion(ctx: click.Context, shell: str) -> None:
    """Print the completion script of SHELL: commands, options, kinds, and the names of objects
    and contexts (asking the cluster of --config/--context, when one is on the line).

    \b
    bash:  source <(llmgw completion bash)        # in ~/.bashrc
    zsh:   source <(llmgw completion zsh)         # in ~/.zshrc, after compinit
    fish:  llmgw completion fish | source         # in ~/.config/fish/config.fish
    """
    root = ctx.find_root().command
    complete = get_completion_class(shell)
    if complete is None:
        raise click.UsageError(f"no completion for {shell}")
    click.echo(complete(root, {}, "llmgw", COMPLETE_VAR).source())

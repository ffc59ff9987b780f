"""The `llmgw` command group; each subcommand lives in its own module, loaded on use."""
from __future__ import annotations

import gc
import importlib
import importlib.util

import click
from click.shell_completion import CompletionItem

# command name -> "module:attribute". Loaded lazily so `llmgw get` does not
# import the agent, the server or the gateway.
COMMANDS: dict[str, str] = {
    "ca": "llmgw.cli.ca:ca",
    "auth": "llmgw.cli.auth:auth",
    "server": "llmgw.cmd.server:server",
    "controller-manager": "llmgw.cmd.controller_manager:controller_manager",
    "agent": "llmgw.cmd.agent:agent",
    "gateway": "llmgw.cmd.gateway:gateway",
    "sim": "llmgw.cmd.sim:sim",
    "dev": "llmgw.cmd.dev:dev",
    # kubectl-like verbs
    "apply": "llmgw.cli.apply:apply",
    "diff": "llmgw.cli.apply:diff",
    "get": "llmgw.cli.get:get",
    "describe": "llmgw.cli.describe:describe",
    "create": "llmgw.cli.create:create",
    "delete": "llmgw.cli.apply:delete",
    "cordon": "llmgw.cli.nodes:cordon",
    "uncordon": "llmgw.cli.nodes:uncordon",
    "drain": "llmgw.cli.nodes:drain",
    "logs": "llmgw.cli.logs:logs",
    "events": "llmgw.cli.events:events",
    "ctl": "llmgw.cli.ctl:ctl",
    "top": "llmgw.cli.top:top",
    "version": "llmgw.cli.version:version",
    "config": "llmgw.cli.config:config",
    "completion": "llmgw.cli.completion:completion",
    "plugin": "llmgw.cli.plugins:plugin",
    **{verb: f"llmgw.cli.gitsources:{verb}" for verb in ("reconcile", "suspend", "resume")},
}


def load(spec: str) -> click.Command:
    """The command a "module:attribute" of COMMANDS names, imported now."""
    module, attr = spec.split(":")
    command: click.Command = getattr(importlib.import_module(module), attr)
    return command


class LazyGroup(click.Group):
    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(set(super().list_commands(ctx)) | {n for n in COMMANDS if self._available(n)})

    @staticmethod
    def _available(name: str) -> bool:
        module = COMMANDS[name].split(":")[0]
        try:
            return importlib.util.find_spec(module) is not None
        except ModuleNotFoundError:
            return False

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        cmd = super().get_command(ctx, name)
        if cmd is not None:
            return cmd
        if name not in COMMANDS or not self._available(name):
            return self._plugin(name)
        return load(COMMANDS[name])

    @staticmethod
    def _plugin(name: str) -> click.Command | None:
        """`llmgw NAME` for no built-in NAME: the executable llmgw-NAME on PATH (llmgw.cli.plugins)."""
        from llmgw.cli import plugins

        found = plugins.find(name)
        return plugins.command(found) if found else None

    def summary(self, ctx: click.Context, name: str, limit: int) -> str:
        """A command's short help, read without importing it where its source allows."""
        from llmgw.cli.summary import summary

        text = summary(COMMANDS[name], limit) if name in COMMANDS else None
        if text is None:
            command = self.get_command(ctx, name)
            text = command.get_short_help_str(limit) if command else ""
        return text

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        """click's list of commands, without importing every one of them."""
        names = self.list_commands(ctx)
        limit = formatter.width - 6 - max(map(len, names))
        with formatter.section("Commands"):
            formatter.write_dl([(name, self.summary(ctx, name, limit)) for name in names])

    def shell_complete(self, ctx: click.Context, incomplete: str) -> list[CompletionItem]:
        """Commands (without importing them), the group's options, and the plugins on PATH."""
        from llmgw.cli import plugins

        items = [CompletionItem(name, help=self.summary(ctx, name, 45))
                 for name in self.list_commands(ctx) if name.startswith(incomplete)]
        items += click.Command.shell_complete(self, ctx, incomplete)   # the options; click.Group's imports
        names = {i.value for i in items}
        for p in plugins.candidates():
            if p.name.startswith(incomplete) and p.name not in names and plugins.executable(p.path):
                names.add(p.name)
                items.append(CompletionItem(p.name))
        return items


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
def cli() -> None:
    """llmgw: run LLM inference engines across a fleet of GPU machines.

    Desired state lives in etcd; controllers reconcile it; an agent on each
    node runs the engines; an OpenAI-compatible gateway routes requests.

    Plugins: an executable llmgw-NAME on PATH runs as `llmgw NAME` (`llmgw plugin list`).
    """


def main() -> None:
    """The `llmgw` script: the group, and a quick exit."""
    try:
        cli()
    finally:
        # The exit's collections walk every object the imports made (~30 ms of a short
        # command); frozen objects are left out of them.
        gc.freeze()


if __name__ == "__main__":
    main()

"""Connection options shared by every verb, and running a verb with its errors turned into exit codes."""
from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

import click
from click.shell_completion import CompletionItem

from llmgw.cli import errors as ec
from llmgw.cli.errors import CliError

if TYPE_CHECKING:
    from llmgw.client import Client, ClientConfig

T = TypeVar("T")
R = TypeVar("R")


@dataclass
class Connection:
    config: str | None = None
    server: str | None = None
    ca: str | None = None
    cert: str | None = None
    key: str | None = None
    context: str | None = None

    def client_config(self) -> ClientConfig:
        """The config file's settings (its --context, else its current one) with any
        --server/--ca/--cert/--key on top.

        With --server, --ca, --cert and --key all given, no file is read.
        """
        from llmgw.client import ClientConfig

        overrides = {k: getattr(self, k) for k in ("server", "ca", "cert", "key") if getattr(self, k)}
        if len(overrides) == 4:
            return ClientConfig(**overrides)
        cfg = ClientConfig.load(self.config, self.context)
        for k, v in overrides.items():
            setattr(cfg, k, v)
        return cfg

    def client(self) -> Client:
        """A client for a command: requests without aiohttp (llmgw.client.oneshot); a watch or a
        followed log imports it when it starts."""
        from llmgw.client import Client

        return Client.from_config(self.client_config(), oneshot=True)


def complete_context(ctx: click.Context, param: click.Parameter, incomplete: str) -> list[CompletionItem]:
    """The contexts of the config file the command line names (or the default one)."""
    from llmgw.client.config import list_contexts

    try:
        contexts = list_contexts(ctx.params.get("config"))
    except Exception:  # noqa: BLE001 - no config or a bad one: nothing to offer
        return []
    return [CompletionItem(c.name, help=c.server) for c in contexts if c.name.startswith(incomplete)]


config_option = click.option(
    "--config", "config", envvar="LLMGW_CONFIG", metavar="FILE",
    help="Client config (server, ca, cert, key; or contexts). Default: $LLMGW_CONFIG, "
         "else ~/.config/llmgw/config.yaml.")

_OPTIONS = [
    config_option,
    click.option("--context", metavar="NAME", shell_complete=complete_context,
                 help="Which of the config's contexts (clusters) to use. Default: its current-context."),
    click.option("--server", metavar="URL", help="Override the config's server URL."),
    click.option("--ca", metavar="FILE", help="Override the config's CA certificate."),
    click.option("--cert", metavar="FILE", help="Override the config's client certificate."),
    click.option("--key", metavar="FILE", help="Override the config's client key."),
]


def connection_options(f: Callable[..., R]) -> Callable[..., R]:
    """Add --config/--context/--server/--ca/--cert/--key; the command receives them as `conn`."""

    @functools.wraps(f)
    def wrapper(*args: Any, config: str | None, context: str | None, server: str | None, ca: str | None,
                cert: str | None, key: str | None, **kw: Any) -> R:
        return f(*args, conn=Connection(config, server, ca, cert, key, context), **kw)

    for option in reversed(_OPTIONS):
        wrapper = option(wrapper)
    return wrapper


def explain(err: BaseException) -> CliError | None:
    """The one-line message and exit code for an error from the client, a manifest or a config."""
    from llmgw.api.errors import AlreadyExists, Conflict, Forbidden, NotFound, Unauthorized
    from llmgw.api.manifests import ManifestError
    from llmgw.api.selectors import SelectorError
    from llmgw.client import ApiError, ConfigError, TLSError, Unreachable

    if isinstance(err, CliError):
        return err
    if isinstance(err, ManifestError):
        return CliError(str(err), ec.USAGE)
    if isinstance(err, (ConfigError, SelectorError)):
        return CliError(str(err), ec.USAGE)
    if isinstance(err, (Unreachable, TLSError)):
        return CliError(str(err), ec.UNREACHABLE)
    if isinstance(err, Forbidden):
        return CliError(_prefixed("forbidden", err), ec.FORBIDDEN)
    if isinstance(err, Unauthorized):
        return CliError(_prefixed("unauthorized", err), ec.FORBIDDEN)
    if isinstance(err, AlreadyExists):
        return CliError(f"already exists: {err}", ec.CONFLICT)
    if isinstance(err, Conflict) and err.reason in ("NameTaken", "OwnedByGitSource"):
        # re-running will not help: another Model holds the name, a GitSource the object
        return CliError(str(err), ec.CONFLICT)
    if isinstance(err, Conflict):
        return CliError(f"conflict: {err}; re-run the command to work on the current version", ec.CONFLICT)
    if isinstance(err, NotFound):
        return CliError(str(err), ec.ERROR)
    if isinstance(err, ApiError):
        return CliError(f"server error {err.code} {err.reason}: {err}".rstrip(": "), ec.ERROR)
    if isinstance(err, FileNotFoundError):
        return CliError(f"{err.filename or err}: no such file or directory"
                        if err.filename else str(err), ec.USAGE)
    return None


def _prefixed(word: str, err: BaseException) -> str:
    text = str(err)
    return text if text.lower().startswith(word) else f"{word}: {text}"


def run(coro: Coroutine[Any, Any, T]) -> T:
    """Run a verb's coroutine; known errors become CliError (one line, exit code by kind)."""
    return checked(lambda: asyncio.run(coro))


def checked(call: Callable[[], T]) -> T:
    """Call `call`; known errors become CliError (one line, exit code by kind)."""
    try:
        return call()
    except KeyboardInterrupt:
        raise click.exceptions.Exit(130) from None
    except Exception as err:
        cli_err = explain(err)
        if cli_err is None:
            raise
        raise cli_err from None


def usage_error(message: str) -> CliError:
    return CliError(message, ec.USAGE)

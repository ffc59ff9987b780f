"""Exit codes of the kubectl-like verbs and the one-line error every failure becomes."""
from __future__ import annotations

from typing import IO, Any

import click

OK = 0
ERROR = 1        # general error; also `diff` found differences, an object not found, a drain Stuck
USAGE = 2        # bad command line, invalid manifest, unreadable client config
UNREACHABLE = 3  # server unreachable or TLS failure
FORBIDDEN = 4    # 403: the certificate may not do this
CONFLICT = 5     # 409: the object changed meanwhile or already exists; re-run

EXIT_CODES_HELP = (
    "\b\nExit codes:\n"
    "  0  success\n"
    "  1  general error, object not found; diff: differences found; drain --wait: drain Stuck\n"
    "  2  usage error, invalid manifest (file, document and field are named), bad client config\n"
    "  3  server unreachable or TLS failure\n"
    "  4  forbidden (403) or certificate refused (401)\n"
    "  5  conflict (409): the object changed meanwhile, re-run the command; or another Model\n"
    "     serves a name or alias of this one (the message names it)"
)


class CliError(click.ClickException):
    """A failure a person can act on: one line on stderr, then exit with `code`."""

    def __init__(self, message: str, code: int = ERROR):
        super().__init__(message)
        self.code = code

    # click declares exit_code a class variable (one code per exception class); ours is per
    # error, and click's main() reads it from the instance.
    @property
    def exit_code(self) -> int:  # type: ignore[override]
        return self.code

    def show(self, file: IO[Any] | None = None) -> None:
        click.echo(f"error: {self.format_message()}", err=True)

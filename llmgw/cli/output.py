"""Printing tables: a rich table on a terminal, plain aligned text into a pipe."""
from __future__ import annotations

import sys
from typing import Sequence

import click
from rich.console import Console
from rich.table import Table

from llmgw.cli.tables import format_table


def is_terminal() -> bool:
    return sys.stdout.isatty()


def rich_table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> Table:
    t = Table(box=None, pad_edge=False, show_edge=False, header_style="bold", padding=(0, 3, 0, 0))
    for h in headers:
        t.add_column(h, no_wrap=True, overflow="fold")
    for r in rows:
        t.add_row(*r)
    return t


def print_table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> None:
    if is_terminal():
        Console().print(rich_table(headers, rows))
    else:
        click.echo(format_table(headers, rows))


class RowPrinter:
    """`get -w` into a pipe: the header once, then a row each time a row changes (as kubectl does)."""

    def __init__(self, headers: Sequence[str]):
        self.headers = list(headers)
        self.widths = [len(h) for h in headers]
        self.last: dict[str, list[str]] = {}
        self.started = False

    def _line(self, row: Sequence[str]) -> str:
        return "   ".join(c.ljust(w) for c, w in zip(row, self.widths, strict=False)).rstrip()

    def show(self, rows: Sequence[Sequence[str]]) -> None:
        """Print the rows (keyed by their first cell) that differ from what was printed last."""
        changed = [list(r) for r in rows if self.last.get(r[0]) != list(r)]
        if not changed and self.started:
            return
        for r in changed:
            self.widths = [max(w, len(c)) for w, c in zip(self.widths, r, strict=False)]
        if not self.started:
            click.echo(self._line(self.headers))
            self.started = True
        for r in changed:
            click.echo(self._line(r))
            self.last[r[0]] = r

"""Rows into text: kubectl's plain columns into a pipe, a rich table on a terminal, a watch's rows.

A row is a list of cells (strings) under a list of headers; the first cell
names the row (a watch prints a row again when it changed).
"""
from __future__ import annotations

import sys
from collections.abc import Iterable, Sequence
from datetime import datetime, timezone
from types import TracebackType
from typing import TYPE_CHECKING

import click

# rich only on a terminal: importing it costs ~20 ms of every command's start, and into a pipe
# (scripts, loops) the plain columns need none of it.
if TYPE_CHECKING:
    from rich.live import Live
    from rich.table import Table

NONE = "<none>"
GAP = "   "   # between columns, as kubectl prints them

Row = Sequence[str]


def human_age(created: datetime | None, now: datetime | None = None) -> str:
    """kubectl's short durations: 45s, 3m20s, 95m, 5h12m, 30h, 3d4h, 120d, 3y."""
    if created is None:
        return "<unknown>"
    now = now or datetime.now(timezone.utc)
    s = max(0, int((now - created).total_seconds()))
    m, h, d = s // 60, s // 3600, s // 86400
    if s < 120:
        return f"{s}s"
    if m < 10:
        return f"{m}m{s % 60}s" if s % 60 else f"{m}m"
    if h < 3:
        return f"{m}m"
    if h < 8:
        return f"{h}h{m % 60}m" if m % 60 else f"{h}h"
    if h < 48:
        return f"{h}h"
    if d < 8:
        return f"{d}d{h % 24}h" if h % 24 else f"{d}d"
    if d < 730:
        return f"{d}d"
    return f"{d // 365}y"


def age_of(ts: object, now: datetime) -> str:
    """How long ago a timestamp (a datetime or an ISO 8601 string) was, as human_age says it."""
    if isinstance(ts, str):
        try:
            ts = datetime.fromisoformat(ts.replace("Z", "+00:00"))
        except ValueError:
            return str(ts)
    if isinstance(ts, datetime):
        if ts.tzinfo is None:
            ts = ts.replace(tzinfo=timezone.utc)
        return human_age(ts, now)
    return NONE


def join(items: Iterable[str]) -> str:
    """Cells' values comma-joined, the empty ones left out; <none> when none is left."""
    items = [i for i in items if i]
    return ",".join(items) if items else NONE


def unique(items: Iterable[str]) -> list[str]:
    """The non-empty values, each once, in their first order."""
    return list(dict.fromkeys(i for i in items if i))


def binary_size(n: int) -> str:
    """Bytes as kubectl shows quantities: the largest of Ki, Mi, Gi, Ti that keeps a whole number."""
    for unit, shift in (("Ti", 40), ("Gi", 30), ("Mi", 20), ("Ki", 10)):
        if n >= 1 << shift:
            return f"{n >> shift}{unit}"
    return str(n)


def _line(row: Row, widths: Sequence[int]) -> str:
    return GAP.join(c.ljust(w) for c, w in zip(row, widths, strict=False)).rstrip()


def format_table(headers: Row, rows: Sequence[Row], header: bool = True) -> str:
    """Plain text, each column as wide as its widest cell, no trailing space."""
    widths = [max(len(r[i]) for r in [headers, *rows]) for i in range(len(headers))]
    return "\n".join(_line(r, widths) for r in ([headers] if header else []) + list(rows))


def section(title: str, headers: Row, rows: Sequence[Row]) -> list[str]:
    """`title:` and the table indented under it, or `<none>`: a part of `describe`."""
    if not rows:
        return [f"{title}:", f"  {NONE}"]
    return [f"{title}:", *("  " + line for line in format_table(headers, rows).splitlines())]


def is_terminal() -> bool:
    return sys.stdout.isatty()


def rich_table(headers: Row, rows: Sequence[Row]) -> Table:
    from rich.table import Table

    t = Table(box=None, pad_edge=False, show_edge=False, header_style="bold", padding=(0, len(GAP), 0, 0))
    for h in headers:
        t.add_column(h, no_wrap=True, overflow="fold")
    for r in rows:
        t.add_row(*r)
    return t


def print_table(headers: Row, rows: Sequence[Row]) -> None:
    if is_terminal():
        from rich.console import Console

        Console().print(rich_table(headers, rows))
    else:
        click.echo(format_table(headers, rows))


class RowPrinter:
    """`get -w` into a pipe: the header once, then a row each time a row changes (as kubectl does)."""

    def __init__(self, headers: Row):
        self.headers = list(headers)
        self.widths = [len(h) for h in headers]
        self.last: dict[str, list[str]] = {}
        self.started = False

    def show(self, rows: Sequence[Row]) -> None:
        """Print the rows (keyed by their first cell) that differ from what was printed last."""
        changed = [list(r) for r in rows if self.last.get(r[0]) != list(r)]
        if not changed and self.started:
            return
        self.append(changed)
        for r in changed:
            self.last[r[0]] = r

    def append(self, rows: Sequence[Row]) -> None:
        """Print the rows as they are, after the header (once), as wide as the widest cell so far."""
        for r in rows:
            self.widths = [max(w, len(c)) for w, c in zip(self.widths, r, strict=False)]
        if not self.started:
            click.echo(_line(self.headers, self.widths))
            self.started = True
        for r in rows:
            click.echo(_line(r, self.widths))


class WatchTable:
    """The table of `get -w`: redrawn in place on a terminal, changed rows into a pipe.

    A context manager: leaving it stops the terminal's live display.
    """

    def __init__(self) -> None:
        self.live = is_terminal()
        self._display: Live | None = None
        self._rows: RowPrinter | None = None

    @property
    def redraws(self) -> bool:
        """Whether the table is on a terminal and drawn: redraw it now and then, so ages move."""
        return self._display is not None

    def show(self, headers: Row, rows: Sequence[Row]) -> None:
        if not self.live:
            self._rows = self._rows or RowPrinter(headers)
            self._rows.show(rows)
            return
        if self._display is None:
            from rich.live import Live

            self._display = Live(rich_table(headers, rows), auto_refresh=False)
            self._display.start()
        self._display.update(rich_table(headers, rows), refresh=True)

    def __enter__(self) -> WatchTable:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if self._display is not None:
            self._display.stop()

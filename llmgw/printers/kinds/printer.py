"""What a kind's printer is (kubectl's printer handlers): the class each kind's module
registers, what its table reads beside its objects, and the registry by kind class.

A printer owns everything the CLI shows of its kind beyond yaml and json: the columns
of `llmgw get`'s table and those `-o wide` adds, the kinds whose every object the
table reads (a node's GPUS and REPLICAS count every Replica's placement), and the
lines `llmgw describe` adds about the objects a person looks at next. The CLI
resolves a typed kind to its class once and asks `printer_of(kind)`; a new kind's
table is one module of this package (docs/architecture.md, "Adding a kind's table").
"""
from __future__ import annotations

import builtins
from collections.abc import AsyncIterator, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, ClassVar, Generic, Protocol, cast

from llmgw.api import AnyObject, ObjectT
from llmgw.api.kinds import all_of_kind
from llmgw.api.logs import LogQuery
from llmgw.api.usage import KeyUsage

Table = tuple[list[str], list[list[str]]]   # headers, rows


class Reader(Protocol):
    """What a printer reads of the cluster beside the objects it shows: the REST client's
    calls (llmgw.client.Client is one), which the printers do not import."""

    async def list(self, kind: type[ObjectT], selector: str | None = None,
                   node: str | None = None) -> tuple[builtins.list[ObjectT], int]: ...

    async def apikey_usage(self, name: str | None = None) -> dict[str, Any]: ...

    def log(self, kind: type[AnyObject], name: str, query: LogQuery, *, rank: int | None = None,
            node: str | None = None) -> AsyncIterator[bytes]: ...


@dataclass(frozen=True)
class Beside:
    """What a table shows beside its objects: every object of the kinds its printer
    `follows`, and (a printer that `reads_usage`) the API keys' usage over the live gateways."""

    followed: Mapping[type[AnyObject], Iterable[AnyObject]] = field(default_factory=dict)
    usage: Mapping[str, KeyUsage] = field(default_factory=dict)

    def of(self, kind: type[ObjectT]) -> list[ObjectT]:
        return all_of_kind(kind, self.followed.get(kind, ()))


def by_name(objects: Iterable[ObjectT]) -> list[ObjectT]:
    return sorted(objects, key=lambda o: o.name)


class KindPrinter(Generic[ObjectT]):
    """One kind's table and describe lines. `rows` gives a row per object, in order;
    `-o wide` puts `wide(obj)`'s cells under `wide_headers` at `wide_at` (the end by default)."""

    headers: ClassVar[list[str]]
    wide_headers: ClassVar[list[str]] = []
    wide_at: ClassVar[int | None] = None
    follows: ClassVar[tuple[type[AnyObject], ...]] = ()   # `get` lists them, `get -w` watches them too
    reads_usage: ClassVar[bool] = False                    # `get -w` reads it again at each change

    def rows(self, objects: Sequence[ObjectT], beside: Beside, now: datetime | None) -> list[list[str]]:
        raise NotImplementedError

    def wide(self, obj: ObjectT) -> list[str]:
        return []

    async def related(self, reader: Reader, obj: ObjectT) -> list[str]:
        """`llmgw describe`'s lines after the conditions: the objects a person looks at next."""
        return []

    def table(self, objects: Sequence[ObjectT], beside: Beside, wide: bool = False,
              now: datetime | None = None) -> Table:
        headers = list(self.headers)
        rows = self.rows(objects, beside, now)
        if wide and self.wide_headers:
            at = len(headers) if self.wide_at is None else self.wide_at
            headers[at:at] = self.wide_headers
            for obj, row in zip(objects, rows, strict=True):
                row[at:at] = self.wide(obj)
        return headers, rows


PRINTERS: dict[type[AnyObject], KindPrinter[Any]] = {}


def register(kind: type[ObjectT]) -> Callable[[type[KindPrinter[ObjectT]]], type[KindPrinter[ObjectT]]]:
    """Make a printer class the one of `kind` (a class decorator)."""

    def add(cls: type[KindPrinter[ObjectT]]) -> type[KindPrinter[ObjectT]]:
        if kind in PRINTERS:
            raise ValueError(f"a printer for {kind.__name__} is registered twice")
        PRINTERS[kind] = cls()
        return cls

    return add


def printer_of(kind: type[ObjectT]) -> KindPrinter[ObjectT]:
    try:
        return cast("KindPrinter[ObjectT]", PRINTERS[kind])
    except KeyError:
        raise ValueError(f"no printer for kind {kind.__name__}") from None


def table(kind: type[AnyObject], objects: Sequence[AnyObject], beside: Beside | None = None, *,
          wide: bool = False, now: datetime | None = None) -> Table:
    """(headers, rows) for objects of one kind, with what its table reads beside them."""
    return printer_of(kind).table(all_of_kind(kind, objects), beside or Beside(), wide, now)

"""The reflector: the one list-then-watch loop that keeps a view in step with a revisioned source.

Its users: the controllers' informers (llmgw.runtime.informer, over the store), the
REST client's ``list_and_watch`` and the gateway's routing table (over the server),
and the server's watch cache (over the store, without lists). Each hands it a
``ListerWatcher``, which says how to list, how to watch from a revision, and what an
error means:

* ``list()`` -> (items, revision): every item, and the revision they were read at;
* ``watch(from_revision)``: an async iterator of events (type, object, revision), the
  changes at ``from_revision`` and after, in order;
* ``after_error(err)``: "relist" when the revision to watch from is gone (etcd
  compacted it: Compacted, 410 Expired), "retry" when the failure is transient (back
  off, then watch again from the last revision seen, or list again when the list
  failed), "resume" when it is transient and ended a watch that was open (the watch
  was established again since the last failure: the backoff starts over, its first
  wait, as after an event), "raise" for the rest (a refusal, a bug), which ends ``run()``.

The loop: list; report what changed since the view's last list, from the view's own
objects (``known``) or from what it reported itself: ADDED, MODIFIED (only what
differs), and a DELETED for each object that vanished meanwhile, with its last state
(a replica deleted while the watch was down must not stay routable); say it has
synced; watch from the list's revision + 1, reporting each event; repeat the watch
from the last revision seen when it ends or drops, and list again only when told.

With ``idle_timeout``, a stream silent that long (for at least half of it, at most all
of it) is re-opened where it left off: it catches a stream that died without an error.
With ``start_revision`` it starts watching from there without a first list (the watch
cache, which holds history, not objects). Events reach ``on_event`` synchronously, one
call each, and the loop awaits nothing per event but the stream itself (it is the hot
path of the controllers and of the server's watch fan-out).
"""
from __future__ import annotations

import asyncio
import builtins
import logging
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Iterable, Sequence
from typing import Generic, Literal, Protocol, TypeVar

from llmgw.api import AnyObject
from llmgw.api.client import EventType
from llmgw.backoff import Backoff

log = logging.getLogger("llmgw.reflector")

T = TypeVar("T")
T_co = TypeVar("T_co", covariant=True)

AfterError = Literal["relist", "retry", "resume", "raise"]

CLOSE_TIMEOUT = 5.0   # closing a watch must not wedge the loop


class Event(Protocol[T_co]):
    """What a watch yields: ``llmgw.api.WatchEvent`` and anything shaped like it."""

    @property
    def type(self) -> EventType: ...

    @property
    def object(self) -> T_co: ...

    @property
    def revision(self) -> int: ...


class ListerWatcher(Protocol[T_co]):
    """A revisioned source of one kind of item (see the module's docstring)."""

    async def list(self) -> tuple[Sequence[T_co], int]: ...

    def watch(self, from_revision: int) -> AsyncIterator[Event[T_co]]: ...

    def after_error(self, err: Exception) -> AfterError: ...


class Reflector(Generic[T]):
    """``await Reflector(lw, on_event, key=...).run()`` runs until cancelled, or until
    ``lw.after_error`` says "raise"; ``on_event(type, item, revision)`` hears every change.

    ``key`` names an item (the diff after a relist matches items by it). ``known``
    returns the items the view holds now; without it the reflector remembers what it
    reported (a dict entry per item, kept on every event). ``on_list(changes, revision)``,
    when given, hears a list's changes at once instead of ``on_event`` one by one (a view
    can take them all in before telling anyone of one). ``on_synced`` is called after
    each list's changes were reported; ``on_gone(err)``, when set, hears each error that
    made it list again (the manager ends a term on an etcd restored under it). ``burst``:
    after that many events in a row the loop lets other tasks run (a long burst would
    starve them).
    """

    def __init__(self, lw: ListerWatcher[T], on_event: Callable[[EventType, T, int], None], *,
                 key: Callable[[T], str], known: Callable[[], Iterable[T]] | None = None,
                 on_list: Callable[[Sequence[tuple[EventType, T]], int], None] | None = None,
                 on_synced: Callable[[], None] | None = None, start_revision: int | None = None,
                 idle_timeout: float | None = None, backoff: Backoff | None = None, burst: int = 0,
                 name: str = "reflector") -> None:
        self.lw = lw
        self.on_event = on_event
        self.key = key
        self.known = known
        self.on_list = on_list
        self.on_synced = on_synced
        self.on_gone: Callable[[Exception], None] | None = None
        self.idle_timeout = idle_timeout
        self.backoff = backoff or Backoff(0.1, 10.0)
        self.burst = burst
        self.name = name
        self._reported: dict[str, T] | None = None if known is not None else {}
        self._must_list = start_revision is None
        self.revision = start_revision or 0   # the last revision seen: a watch resumes after it
        self.lists = 0       # how many lists succeeded (1 + relists)
        self.reopens = 0     # how many silent streams were re-opened

    async def run(self) -> None:
        while True:
            _raise_if_cancelling()
            if self._must_list:
                try:
                    items, revision = await self.lw.list()
                except Exception as err:
                    if self.lw.after_error(err) == "raise":
                        raise
                    delay = self.backoff.next()
                    log.warning("%s: list failed (%s); listing again in %.2fs", self.name, err, delay)
                    await asyncio.sleep(delay)
                    continue
                self.backoff.reset()
                self._report_list(items, revision)   # should it raise, run() lists again when run again
                self._must_list = False
                self.lists += 1
                self.revision = revision
                if self.on_synced is not None:
                    self.on_synced()
            try:
                await self._watch()
                why = "ended its watch"
            except Exception as err:
                after = self.lw.after_error(err)
                if after == "raise":
                    raise
                if after == "relist":
                    log.info("%s: revision %d is gone (%s); listing again", self.name, self.revision + 1, err)
                    self._must_list = True
                    if self.on_gone is not None:
                        self.on_gone(err)
                    continue
                if after == "resume":
                    self.backoff.reset()
                why = f"interrupted ({err})"
            delay = self.backoff.next()
            log.warning("%s %s; watching again from revision %d in %.2fs", self.name, why, self.revision + 1, delay)
            await asyncio.sleep(delay)

    def _report_list(self, items: Sequence[T], revision: int) -> None:
        """Report what a list changed: the diff after a (re)list."""
        key = self.key
        held: Iterable[T] = self.known() if self.known is not None else (self._reported or {}).values()
        before = {key(item): item for item in held}
        changes: builtins.list[tuple[EventType, T]] = []
        for item in items:
            old = before.pop(key(item), None)
            if old is None:
                changes.append(("ADDED", item))
            elif old != item:
                changes.append(("MODIFIED", item))
        changes.extend(("DELETED", old) for old in before.values())
        if self.on_list is not None:
            self.on_list(changes, revision)
        else:
            for type_, item in changes:
                self.on_event(type_, item, revision)
        if self._reported is not None:
            self._reported = {key(item): item for item in items}

    async def _watch(self) -> None:
        """Watch after ``self.revision`` until the stream ends or fails; re-open a silent one."""
        loop = asyncio.get_running_loop()
        idle, burst, on_event, reported, key = self.idle_timeout, self.burst, self.on_event, self._reported, self.key
        while True:
            _raise_if_cancelling()
            stream = self.lw.watch(self.revision + 1)
            n = 0
            try:
                async with asyncio.timeout(idle) as deadline:
                    async for ev in stream:
                        if idle is not None:
                            # The deadline moves only once less than half of it is left, so an
                            # event costs no timer. (wait_for per event made a task and a timer
                            # for each, about 17 us; the control-plane benchmark's
                            # controller-manager spent 2 of its 11 CPU seconds less without.)
                            now = loop.time()
                            when = deadline.when()
                            if when is not None and when - now < idle / 2:
                                deadline.reschedule(now + idle)
                        type_, item, revision = ev.type, ev.object, ev.revision
                        if revision > self.revision:
                            self.revision = revision
                        if reported is not None:
                            if type_ == "DELETED":
                                reported.pop(key(item), None)
                            else:
                                reported[key(item)] = item
                        on_event(type_, item, revision)
                        n += 1
                        if burst and n % burst == 0:
                            await asyncio.sleep(0)
                return
            except TimeoutError:
                if not deadline.expired():
                    raise
                log.debug("%s: stream silent for %.0fs; re-opening", self.name, (idle or 0) / 2)
                self.reopens += 1
            finally:
                if n:
                    self.backoff.reset()
                if isinstance(stream, AsyncGenerator):
                    try:
                        await asyncio.wait_for(stream.aclose(), CLOSE_TIMEOUT)
                    except (Exception, asyncio.TimeoutError):  # noqa: BLE001
                        log.debug("%s: closing the watch stream failed or hung", self.name)


def object_name(obj: AnyObject) -> str:
    """The key of an API object in a reflector: its name."""
    return obj.metadata.name


def _raise_if_cancelling() -> None:
    """Python 3.11's wait_for can swallow a cancellation that races with its result;
    a loop that never checks would then outlive whoever cancelled it."""
    task = asyncio.current_task()
    if task is not None and task.cancelling():
        raise asyncio.CancelledError

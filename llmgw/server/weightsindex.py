"""Which Nodes hold or pull a model's weights: `GET /apis/llmgw.io/v1/nodes?weights=SOURCE[&digest=D]`.

A pulling agent asks before each file which nodes it may read it from (llmgw/weights/peers.py).
Answered from a list of every Node, that question cost the server a decode and an encode of the
whole fleet each time (at 10,000 nodes about 2 s of CPU and 23 MB, per file of every pull) and
the agent the same decode. So the server keeps an index instead, fed by one reflector over the
store's Nodes, started by the first such request: each Node whose status.weights names anything
(a content digest or a source it holds, a source it is pulling), under each of those refs. A
request is answered from it in time and bytes that grow with the Nodes it names, not with the
fleet.

The index follows etcd by a watch, so it may trail a write by the watch's delay; a pull reads it
as a hint (every byte is verified by its sha256, and the origin is always the last resort).
"""
from __future__ import annotations

import asyncio
from collections.abc import Iterable

from llmgw.api import Node, errors
from llmgw.api.client import EventType
from llmgw.backoff import Backoff
from llmgw.reflector import Reflector
from llmgw.store import Store
from llmgw.store.listwatch import after_store_error_never_raise

SYNC_TIMEOUT = 10.0     # seconds a request waits for the first list before it is answered 503


def refs_of(node: Node) -> frozenset[str]:
    """What a Node's weights name: the digests and sources of what it holds, the sources it pulls."""
    w = node.status.weights
    if w is None:
        return frozenset()
    return frozenset([*(m.digest for m in w.models), *(s for m in w.models for s in m.sources),
                      *(p.source for p in w.pulls)])


class WeightsIndex:
    def __init__(self, store: Store) -> None:
        self._nodes: dict[str, tuple[Node, frozenset[str]]] = {}    # only Nodes that name something
        self._by_ref: dict[str, set[str]] = {}
        self._synced = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        # a failure but a compaction is retried: requests wait for the index, never break it
        self._reflector = Reflector(store.lister_watcher(Node, after_store_error_never_raise), self._change,
                                    key=lambda n: n.name, known=lambda: (n for n, _ in self._nodes.values()),
                                    on_synced=self._synced.set, backoff=Backoff(0.1, 5.0), burst=256,
                                    name="weights index")

    async def nodes(self, refs: Iterable[str]) -> tuple[list[Node], int]:
        """The Nodes that name any of `refs`, by name, and the revision the index is at."""
        if self._task is None:
            self._task = asyncio.create_task(self._reflector.run())
        if not self._synced.is_set():   # the first questions wait for the first list; later ones do not
            try:
                await asyncio.wait_for(self._synced.wait(), SYNC_TIMEOUT)
            except asyncio.TimeoutError:
                raise errors.Unavailable("the index of the nodes' weights is not listed yet "
                                         "(is etcd reachable?)") from None
        names: set[str] = set().union(*(self._by_ref.get(r, ()) for r in refs))
        return [self._nodes[n][0] for n in sorted(names)], self._reflector.revision

    def _change(self, type_: EventType, node: Node, revision: int) -> None:
        old = self._nodes.pop(node.name, None)
        refs = frozenset() if type_ == "DELETED" else refs_of(node)
        if old is not None:
            for r in old[1] - refs:
                names = self._by_ref[r]
                names.discard(node.name)
                if not names:
                    del self._by_ref[r]
        if refs:
            self._nodes[node.name] = (node, refs)
            for r in refs:
                self._by_ref.setdefault(r, set()).add(node.name)

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

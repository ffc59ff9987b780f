"""The gateway's KV indexes: one per model, kept from the KV events of each replica that publishes them.

Every gateway subscribes to every publishing replica itself (ZeroMQ fans a PUB
out to its subscribers), so gateways share nothing and agree because they read
the same events; what a gateway adds costs the engine one more subscriber, not
the other gateways anything. A replica is followed while it is in the routing
table with an events endpoint (Replica status.kvEvents); when it leaves, or its
endpoints change (a new engine process), its subscription stops and its entries
are dropped. precise-prefix reads its model's index (llmgw.routing.precise_prefix).
"""
from __future__ import annotations

import asyncio
import logging
import os
import tempfile
from collections.abc import Iterable, Iterator, Mapping
from functools import partial
from typing import TYPE_CHECKING

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.metrics_core import Metric

from llmgw.api.sources import HubSource, default_hub, parse_source
from llmgw.engines import ENGINES
from llmgw.gateway.table import Backend
from llmgw.kvevents.subscriber import Subscription
from llmgw.kvevents.wire import Event
from llmgw.routing.chattemplate import ChatTemplate, load_chat_template
from llmgw.routing.kvblocks import VLLM_HASHES, load_tokenizer
from llmgw.routing.kvindex import KVIndex

if TYPE_CHECKING:
    from tokenizers import Tokenizer

log = logging.getLogger("llmgw.gateway")

TOPIC = ""  # the renderers leave vLLM's default topic: every batch
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja")


class KVIndexes:
    def __init__(self) -> None:
        self.indexes: dict[str, KVIndex] = {}  # model -> its index
        self._subs: dict[str, tuple[Backend, Subscription]] = {}  # replica -> (as followed, its subscription)
        self._tokenizers: dict[str | None, tuple[Tokenizer | None, ChatTemplate | None]] = {}  # by Models' sources
        self._refusals: set[str] = set()  # models whose refusal (or keys that never match) was logged
        self._sources: dict[str, str | None] = {}  # model -> its spec.source, as last synced
        self._fetches: set[asyncio.Task[None]] = set()  # hub tokenizers being fetched

    def index(self, model: str) -> KVIndex:
        kv = self.indexes.get(model)
        if kv is None:
            kv = self.indexes[model] = KVIndex()
        return kv

    def sync(self, backends: Iterable[Backend], sources: Mapping[str, str | None] | None = None) -> None:
        """Follow exactly the replicas of `backends` that publish events (in the running loop); each
        model of `sources` (name -> its spec.source) tokenizes with the tokenizer.json found there
        (a directory here, or a hub repository's files, fetched in the background)."""
        self._sources = dict(sources or {})
        for model, source in self._sources.items():
            if source not in self._tokenizers:
                hub = _hub(source)
                self._tokenizers[source] = self._load(model, source) if hub is None else (None, None)
                if hub is not None:
                    task = asyncio.get_running_loop().create_task(self._fetch(model, source, hub))
                    self._fetches.add(task)
                    task.add_done_callback(self._fetches.discard)
            self.index(model).tokenizer, self.index(model).template = self._tokenizers[source]
        want = {b.replica: b for b in backends if b.kv_events}
        for name, (b, sub) in list(self._subs.items()):
            if want.get(name) != b:
                del self._subs[name]
                sub.cancel()
                self.index(b.model).drop(name)
                self.index(b.model).hashes.pop(name, None)
        for name, b in want.items():
            if name not in self._subs:
                assert b.kv_events
                kv = self.index(b.model)
                kv.hashes[name] = ENGINES[b.engine].block_hashes if b.engine in ENGINES else VLLM_HASHES
                sub = Subscription(name, b.kv_events, b.kv_replay, TOPIC,
                                   partial(self._apply, b.model), kv.drop)
                sub.start()
                self._subs[name] = (b, sub)

    @staticmethod
    def _load(model: str, source: str | None) -> tuple[Tokenizer | None, ChatTemplate | None]:
        """The tokenizer and chat template of a Model whose source is a directory on this machine."""
        if not source or not os.path.isdir(source):
            return None, None
        try:
            tokenizer = load_tokenizer(source)
        except ValueError as e:
            log.warning("model %s: %s: words are tokens", model, e)
            return None, None
        try:
            return tokenizer, load_chat_template(source)
        except ValueError as e:
            log.warning("model %s: %s: a chat's messages are tokenized one by one", model, e)
            return tokenizer, None

    async def _fetch(self, model: str, source: str | None, hub: HubSource) -> None:
        self._tokenizers[source] = await asyncio.to_thread(self._from_hub, model, hub)
        for name, its in self._sources.items():
            if its == source:
                self.index(name).tokenizer, self.index(name).template = self._tokenizers[source]

    @classmethod
    def _from_hub(cls, model: str, hub: HubSource) -> tuple[Tokenizer | None, ChatTemplate | None]:
        """The tokenizer files of a hub repository (those it has of TOKENIZER_FILES: small files, never
        weights), asked of HF_ENDPOINT (else the hub) with HF_TOKEN as every hub client does, and read
        from a directory that is gone once they are loaded."""
        from huggingface_hub import hf_hub_download  # as the agent: only where a Model comes from a hub
        from huggingface_hub.errors import EntryNotFoundError

        with tempfile.TemporaryDirectory(prefix="llmgw-tokenizer-") as directory:
            for name in TOKENIZER_FILES:
                try:
                    hf_hub_download(hub.repo, name, revision=hub.revision, local_dir=directory,
                                    endpoint=default_hub())
                except EntryNotFoundError:
                    continue
                except Exception as e:  # noqa: BLE001 the hub client's errors are its HTTP library's too
                    log.warning("model %s: %s: %s: %s: words are tokens", model, hub.text, name,
                                str(e).splitlines()[0] if str(e) else type(e).__name__)
                    return None, None
            return cls._load(model, directory)

    def _apply(self, model: str, replica: str, events: list[Event]) -> None:
        kv = self.index(model)
        kv.apply(replica, events)
        if kv.refused is None and kv.unmatched is None:
            self._refusals.discard(model)  # an index started afresh (kvindex.KVIndex.drop)
        if model in self._refusals:
            return
        if kv.refused is not None:
            self._refusals.add(model)
            log.error("model %s: precise-prefix refuses the KV index and routes as prefix-score: %s",
                      model, kv.refused)
        elif kv.unmatched is not None:
            self._refusals.add(model)
            log.warning("model %s: precise-prefix: %s", model, kv.unmatched)

    async def close(self) -> None:
        for task in list(self._fetches):
            task.cancel()
        subs = [sub for _, sub in self._subs.values()]
        self._subs.clear()
        for sub in subs:
            await sub.close()

    # ------------------------------------------------------------ metrics (a collector)

    def describe(self) -> Iterator[Metric]:
        return iter(())

    def collect(self) -> Iterator[Metric]:
        blocks = GaugeMetricFamily("llmgw_gateway_kv_index_blocks",
                                   "Blocks the engines' KV events say a replica holds", labels=["model", "replica"])
        refused = GaugeMetricFamily(
            "llmgw_gateway_kv_index_refused",
            "1 where the engines' block hashes cannot match the gateway's (a seed, algorithm or block size "
            "mismatch): precise-prefix routes as prefix-score", labels=["model"])
        verified = CounterMetricFamily("llmgw_gateway_kv_index_verified_chains",
                                       "Stored chains whose hashes the gateway computed the same (a replica's "
                                       "until one agrees)", labels=["model"])
        lookups = CounterMetricFamily("llmgw_gateway_kv_index_lookups",
                                      "Requests precise-prefix looked up in the index", labels=["model"])
        matched = CounterMetricFamily("llmgw_gateway_kv_index_matched_lookups",
                                      "Lookups whose first block some replica held", labels=["model"])
        lag = GaugeMetricFamily("llmgw_gateway_kv_event_lag_seconds",
                                "From the last KV event batch's publication to its arrival", labels=["replica"])
        lost = CounterMetricFamily("llmgw_gateway_kv_event_gaps_lost",
                                   "Sequence gaps the replay endpoint could not fill", labels=["replica"])
        for model, kv in sorted(self.indexes.items()):
            refused.add_metric([model], 1 if kv.refused else 0)
            verified.add_metric([model], kv.verified)
            lookups.add_metric([model], kv.lookups)
            matched.add_metric([model], kv.matched)
        for name, (b, sub) in sorted(self._subs.items()):
            blocks.add_metric([b.model, name], self.index(b.model).blocks_of(name))
            lag.add_metric([name], sub.lag)
            lost.add_metric([name], sub.lost)
        yield from (blocks, refused, verified, lookups, matched, lag, lost)


def _hub(source: str | None) -> HubSource | None:
    try:
        pulled = parse_source(source) if source else None
    except ValueError:  # the api refused it already
        return None
    return pulled if isinstance(pulled, HubSource) else None

"""Rank 0's HTTP API: OpenAI-compatible endpoints with fake tokens, /health and /metrics.

As vLLM's: /v1/completions, /v1/chat/completions, /v1/responses (a response made with `store`,
the default, is kept in this engine's memory, and GET /v1/responses/{id} answers it; a
`previous_response_id` it does not hold is a 404),
/tokenize and /detokenize (with the model's tokenizer.json, else a word is a token), and
/rerank (a document's score: the share of the query's words it has), /pooling and /classify
(each input's words counted), /v1/audio/transcriptions and /v1/audio/translations (a multipart
upload, its file's size and name told back as its text).

/health answers 503 while loading or draining, 200 when ready. /metrics uses
vLLM's metric names (vllm:num_requests_running, vllm:generation_tokens_total,
...) so whatever reads a vLLM replica's load reads a sim replica's too. With
--enable-lora it serves vLLM's runtime LoRA API (/v1/load_lora_adapter,
/v1/unload_lora_adapter: vLLM's request fields, plain-text successes and error
bodies), and a loaded adapter's name is a model it answers to. With --api sglang it plays
SGLang's instead (llmgw.sim.sglang: /load_lora_adapter, /unload_lora_adapter, an adapter
requested as BASE:ADAPTER, SGLang's KV events).
"""
from __future__ import annotations

import asyncio
import itertools
import json
import logging
import os
import sys
import time
from collections.abc import AsyncGenerator, Awaitable, Callable
from typing import Any

from aiohttp import web

from llmgw.kvevents.publisher import Publisher
from llmgw.routing.chattemplate import load_chat_template
from llmgw.routing.kvblocks import load_tokenizer, request_token_ids
from llmgw.sim import sglang, tokens
from llmgw.sim.config import SimConfig
from llmgw.sim.kvcache import PrefixCache
from llmgw.sim.scheduler import Scheduler, Seq

DEFAULT_MAX_TOKENS = 16
JSON = "application/json"

log = logging.getLogger("llmgw.sim")


def error(status: int, message: str, kind: str, param: str | None = None) -> web.Response:
    body = {"error": {"message": message, "type": kind, "param": param, "code": status}}
    return web.Response(status=status, body=json.dumps(body).encode(), content_type=JSON)


async def _join_trace(request: web.Request, response: web.StreamResponse) -> None:
    """W3C Trace Context, as an engine with tracing does: a request's `traceparent` is joined
    (logged with the request, at debug) and answered with a `traceresponse` of the same trace id
    and this engine's span."""
    parent = request.headers.get("traceparent", "")
    parts = parent.strip().lower().split("-")
    if len(parts) != 4 or len(parts[1]) != 32 or len(parts[2]) != 16:
        return
    span = os.urandom(8).hex()
    log.debug("%s %s traceparent=%s span=%s", request.method, request.path, parent, span)
    response.headers["traceresponse"] = f"00-{parts[1]}-{span}-{parts[3]}"


def sse(obj: Any) -> bytes:
    return b"data: " + json.dumps(obj, separators=(",", ":")).encode() + b"\n\n"


DONE = b"data: [DONE]\n\n"


class _BadRequest(Exception):
    def __init__(self, response: web.Response):
        self.response = response


def _say(line: str) -> None:
    """A line of the engine's log (stderr), as vLLM logs its adapters' loads and unloads."""
    print(line, file=sys.stderr, flush=True)


async def _json_object(request: web.Request) -> dict[str, Any]:
    try:
        body = json.loads(await request.read())
    except ValueError as e:
        raise _BadRequest(error(400, f"the request body is not JSON: {e}", "BadRequestError")) from None
    if not isinstance(body, dict):
        raise _BadRequest(error(400, "the request body must be a JSON object", "BadRequestError"))
    return body


class SimApi:
    def __init__(self, cfg: SimConfig, crash: Callable[[str], None]):
        self.cfg = cfg
        self.crash = crash
        self.names = set(cfg.served_model_names)
        self.pacer = tokens.Pacer(cfg.ttft_ms, cfg.tokens_per_second)
        self.tokenizer = load_tokenizer(cfg.model_path)  # the model's tokenizer.json, else words are tokens
        self.template = load_chat_template(cfg.model_path)  # its chat template, rendered as vLLM renders it
        self.sglang = cfg.api == "sglang"
        self.publisher = None
        if cfg.kv_events.enabled:
            self.publisher = Publisher(cfg.kv_events, cfg.host, sglang.encode_batch, replay_topic=True) \
                if self.sglang else Publisher(cfg.kv_events, cfg.host)
        self.cache = PrefixCache(cfg.block_size, cfg.kv_cache_tokens,
                                 self.publisher.publish if self.publisher is not None else None, cfg.api)
        # The step model when it has a cost; else requests are paced one by one (--ttft-ms,
        # --tokens-per-second) and never wait for each other.
        self.scheduler = None
        if cfg.prefill_ms_per_token or cfg.decode_ms_per_token:
            self.scheduler = Scheduler(self.cache, cfg.prefill_ms_per_token, cfg.decode_ms_per_token,
                                       cfg.max_num_seqs)
        self.held_tokens = 0  # prompt + completion tokens of the requests in flight (paced)
        self.ready = False
        self.draining = False
        self.running = 0
        self.received = 0  # generation requests, for --crash-on-request
        self.succeeded = 0
        self.prompt_tokens = 0
        self.generation_tokens = 0
        self.loras: dict[str, str] = {}          # loaded LoRA adapter -> its lora_path
        self.lora_ids: dict[str, int] = {}       # loaded LoRA adapter -> its load's id, vLLM's lora_int_id
        self._lora_loads = itertools.count(1)
        self._loading: set[str] = set()          # adapters whose load is under way
        self._pinned: set[str] = set()           # SGLang's adapters loaded with "pinned"
        self._lora_lock = asyncio.Lock()         # SGLang loads and unloads one at a time
        self._ids = itertools.count(1)
        self._id_prefix = os.urandom(4).hex()
        self._runner: web.AppRunner | None = None
        self.stored: dict[str, dict[str, Any]] = {}   # the Responses API's stored responses, by id

    # ---------------------------------------------------------- lifecycle

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/health", self.health)
        app.router.add_get("/metrics", self.metrics)
        app.router.add_get("/v1/models", self.models)
        app.router.add_post("/v1/completions", self.completions)
        app.router.add_post("/v1/chat/completions", self.chat_completions)
        app.router.add_post("/v1/responses", self.responses)
        app.router.add_get("/v1/responses/{response_id}", self.retrieve)
        app.router.add_post("/tokenize", self.tokenize)
        app.router.add_post("/detokenize", self.detokenize)
        app.router.add_post("/rerank", self.rerank)
        app.router.add_post("/v1/rerank", self.rerank)
        app.router.add_post("/pooling", self.pooling)
        app.router.add_post("/classify", self.classify)
        app.router.add_post("/v1/audio/transcriptions", self.transcribe)
        app.router.add_post("/v1/audio/translations", self.transcribe)
        app.router.add_post("/reset_prefix_cache", self.reset_prefix_cache)
        if self.sglang:  # served with or without --enable-lora, as SGLang's
            app.router.add_post(sglang.LOAD, self.sglang_load_lora_adapter)
            app.router.add_post(sglang.UNLOAD, self.sglang_unload_lora_adapter)
        elif self.cfg.enable_lora:
            app.router.add_post("/v1/load_lora_adapter", self.load_lora_adapter)
            app.router.add_post("/v1/unload_lora_adapter", self.unload_lora_adapter)
        app.on_response_prepare.append(_join_trace)
        return app

    async def start(self) -> None:
        """Bind the serve port; ready after --load-seconds."""
        self._runner = web.AppRunner(
            self.app(), access_log=None, handle_signals=False, shutdown_timeout=self.cfg.drain_grace,
        )
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.cfg.host, self.cfg.port, backlog=4096, reuse_address=True)
        await site.start()
        if self.publisher is not None:
            self.publisher.start()
        if self.cfg.load_seconds > 0:
            asyncio.get_running_loop().call_later(self.cfg.load_seconds, self._set_ready)
        else:
            self._set_ready()

    def _set_ready(self) -> None:
        self.ready = True

    async def drain(self) -> None:
        """Stop accepting, let in-flight requests finish (at most --drain-grace), close."""
        self.draining = True
        if self._runner is not None:
            await self._runner.cleanup()
        if self.publisher is not None:
            await self.publisher.close()

    # ------------------------------------------------------------ helpers

    def _unavailable(self) -> web.Response | None:
        if self.draining:
            return error(503, "the server is shutting down", "ServiceUnavailableError")
        if not self.ready:
            return error(503, "the model is still loading", "ServiceUnavailableError")
        return None

    def _id(self, prefix: str) -> str:
        return f"{prefix}-{self._id_prefix}{next(self._ids)}"

    async def _body(self, request: web.Request) -> dict[str, Any]:
        """The request's JSON body, naming a model this engine serves; 503 while loading or draining."""
        unavailable = self._unavailable()
        if unavailable is not None:
            raise _BadRequest(unavailable)
        body = await _json_object(request)
        self._serves(body.get("model"))
        return body

    def _serves(self, model: object) -> None:
        if self.sglang and (adapter := sglang.adapter_of(model, self.cfg.model)) is not None:
            if adapter not in self.loras:
                raise _BadRequest(error(400, sglang.not_loaded(adapter, self.loras), "BadRequestError"))
            self.loras[adapter] = self.loras.pop(adapter)  # the most recently used
            return
        if model not in self.names and model not in self.loras:
            raise _BadRequest(error(404, f"The model `{model}` does not exist; this server serves "
                                         f"{', '.join(self.cfg.served_model_names)}", "NotFoundError"))

    @staticmethod
    def _max_tokens(body: dict[str, Any], *keys: str) -> int:
        for key in keys:
            value = body.get(key)
            if value is None:
                continue
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise _BadRequest(error(400, f"{key} must be a positive integer, not {value!r}", "BadRequestError"))
            return value
        return DEFAULT_MAX_TOKENS

    def _admit(self) -> None:
        self.received += 1
        if self.cfg.crash_on_request is not None and self.received == self.cfg.crash_on_request:
            self.crash(f"injected crash on generation request {self.received}")

    # ----------------------------------------------------------- handlers

    async def health(self, request: web.Request) -> web.Response:
        if self.draining:
            return web.Response(status=503, body=b'{"status":"draining"}', content_type=JSON)
        if not self.ready:
            return web.Response(status=503, body=b'{"status":"loading"}', content_type=JSON)
        return web.Response(body=b'{"status":"ok"}', content_type=JSON)

    async def models(self, request: web.Request) -> web.Response:
        unavailable = self._unavailable()
        if unavailable is not None:
            return unavailable
        created = int(time.time())
        data = [{"id": name, "object": "model", "created": created, "owned_by": "llmgw-sim",
                 "root": self.cfg.model, "parent": None} for name in self.cfg.served_model_names]
        data += [{"id": name, "object": "model", "created": created, "owned_by": "llmgw-sim", "root": path,
                  "parent": self.cfg.model} for name, path in self.loras.items()]
        return web.Response(body=json.dumps({"object": "list", "data": data}).encode(), content_type=JSON)

    async def metrics(self, request: web.Request) -> web.Response:
        label = '{model_name="%s"}' % self.cfg.model
        sched = self.scheduler
        running = len(sched.running) if sched else self.running
        waiting = len(sched.waiting) if sched else 0
        held = sched.context_tokens if sched else self.held_tokens
        capacity = self.cache.capacity_blocks * self.cache.block_size
        lines = []
        for name, kind, help_, value in (
            ("vllm:num_requests_running", "gauge", "Requests being prefilled or decoded.", running),
            ("vllm:num_requests_waiting", "gauge", "Requests waiting for a running slot.", waiting),
            ("vllm:kv_cache_usage_perc", "gauge", "Share of the KV cache the running requests hold "
             "(1 = full).", min(1.0, held / capacity) if capacity else 0.0),
            ("vllm:prefix_cache_queries_total", "counter", "Prompt tokens looked up in the prefix cache.",
             self.cache.queries),
            ("vllm:prefix_cache_hits_total", "counter", "Prompt tokens found in the prefix cache.",
             self.cache.hits),
            ("vllm:prompt_tokens_total", "counter", "Prompt tokens processed.", self.prompt_tokens),
            ("vllm:generation_tokens_total", "counter", "Tokens generated.", self.generation_tokens),
            ("vllm:request_success_total", "counter", "Requests finished.", self.succeeded),
        ):
            lines += [f"# HELP {name} {help_}", f"# TYPE {name} {kind}", f"{name}{label} {value}"]
        return web.Response(text="\n".join(lines) + "\n", content_type="text/plain", charset="utf-8")

    async def reset_prefix_cache(self, request: web.Request) -> web.Response:
        """vLLM's endpoint of the same name: forget every cached block (the counters stay)."""
        self.cache.reset()
        return web.Response(text="OK")

    async def load_lora_adapter(self, request: web.Request) -> web.Response:
        """vLLM's POST /v1/load_lora_adapter: 200 and a plain-text success; 400 InvalidUserInput
        without both fields or for a name loaded already; 404 NotFoundError for a path with no
        adapter. --lora-load-seconds pass before it is answered (and usable)."""
        try:
            body = await _json_object(request)
        except _BadRequest as bad:
            return bad.response
        name, path = body.get("lora_name"), body.get("lora_path")
        if not name or not path or not isinstance(name, str) or not isinstance(path, str):
            return error(400, "Both 'lora_name' and 'lora_path' must be provided.", "InvalidUserInput")
        if name in self.loras or name in self._loading:
            return error(400, f"The lora adapter '{name}' has already been loaded.", "InvalidUserInput")
        if len(self.loras) + len(self._loading) >= self.cfg.max_loras:
            return error(400, f"Loading lora {name} failed: all {self.cfg.max_loras} LoRA slots are in use "
                              f"(--max-loras): unload one first", "BadRequestError")
        self._loading.add(name)
        try:
            await asyncio.sleep(self.cfg.lora_load_seconds)
            if not await asyncio.to_thread(os.path.exists, path):
                return error(404, f"Loading lora {name} failed: No adapter found for {path}", "NotFoundError")
            self.loras[name] = path
            self.lora_ids[name] = next(self._lora_loads)
        finally:
            self._loading.discard(name)
        _say(f"Loaded new LoRA adapter: name '{name}', path '{path}'")
        return web.Response(text=f"Success: LoRA adapter '{name}' added successfully.")

    async def unload_lora_adapter(self, request: web.Request) -> web.Response:
        """vLLM's POST /v1/unload_lora_adapter: 200 and a plain-text success; 400 without a name;
        404 NotFoundError for one not loaded."""
        try:
            body = await _json_object(request)
        except _BadRequest as bad:
            return bad.response
        name = body.get("lora_name")
        if not name and not body.get("lora_int_id"):
            return error(400, "either 'lora_name' and 'lora_int_id' needs to be provided.", "InvalidUserInput")
        if not isinstance(name, str) or self.loras.pop(name, None) is None:
            return error(404, f"The lora adapter '{name}' cannot be found.", "NotFoundError")
        del self.lora_ids[name]
        _say(f"Removed LoRA adapter: name '{name}'")
        return web.Response(text=f"Success: LoRA adapter '{name}' removed successfully.")

    async def sglang_load_lora_adapter(self, request: web.Request) -> web.Response:
        """SGLang's POST /load_lora_adapter (llmgw.sim.sglang): --lora-load-seconds pass before it is
        answered; past --max-loras the least recently used unpinned adapter is unloaded."""
        try:
            body = await _json_object(request)
        except _BadRequest as bad:
            return bad.response
        if (lacking := sglang.missing(body, "lora_name", "lora_path")) is not None:
            return lacking
        name, path = body["lora_name"], body["lora_path"]
        if not self.cfg.enable_lora:
            return sglang.answer(False, self.loras, sglang.NOT_ENABLED)
        async with self._lora_lock:
            await asyncio.sleep(self.cfg.lora_load_seconds)
            failure = await asyncio.to_thread(sglang.load_failure, name, path, self.loras)
            if failure is not None:
                return sglang.answer(False, self.loras, failure)
            self.loras[name] = path
            self.lora_ids[name] = next(self._lora_loads)
            if body.get("pinned") is True:
                self._pinned.add(name)
            _say(f"LoRA adapter loading completes: name '{name}', path '{path}'")
            while len(self.loras) > self.cfg.max_loras:
                lru = next((n for n in self.loras if n not in self._pinned), None)
                if lru is None:
                    break
                self._sglang_unload(lru)
            return sglang.answer(True, self.loras)

    async def sglang_unload_lora_adapter(self, request: web.Request) -> web.Response:
        """SGLang's POST /unload_lora_adapter (llmgw.sim.sglang)."""
        try:
            body = await _json_object(request)
        except _BadRequest as bad:
            return bad.response
        if (lacking := sglang.missing(body, "lora_name")) is not None:
            return lacking
        if not self.cfg.enable_lora:
            return sglang.answer(False, self.loras, sglang.NOT_ENABLED)
        async with self._lora_lock:
            failure = sglang.unload_failure(body["lora_name"], self.loras)
            if failure is not None:
                return sglang.answer(False, self.loras, failure)
            self._sglang_unload(body["lora_name"])
            return sglang.answer(True, self.loras)

    def _sglang_unload(self, name: str) -> None:
        del self.loras[name], self.lora_ids[name]
        self._pinned.discard(name)
        _say(f"LoRA adapter unloading completes: name '{name}'")

    def _adapter(self, model: str) -> str:
        """The name of the adapter a request's model names (the model itself but for SGLang's BASE:ADAPTER)."""
        return (sglang.adapter_of(model, self.cfg.model) or model) if self.sglang else model

    def _token_ids(self, body: dict[str, Any]) -> list[int]:
        """A request's prompt token ids; a chat its template refuses is a 400, as vLLM answers it."""
        try:
            return request_token_ids(body, self.tokenizer, self.template)
        except ValueError as e:
            raise _BadRequest(error(400, str(e), "BadRequestError")) from None

    async def completions(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, chat=False)

    async def chat_completions(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, chat=True)

    async def _generate(self, request: web.Request, chat: bool) -> web.StreamResponse:
        try:
            body = await self._body(request)
            if chat:
                messages = body.get("messages")
                if not isinstance(messages, list) or not messages:
                    raise _BadRequest(error(400, "messages must be a non-empty list", "BadRequestError"))
                n = self._max_tokens(body, "max_completion_tokens", "max_tokens")
            else:
                if "prompt" not in body or not isinstance(body["prompt"], (str, list)):
                    raise _BadRequest(error(400, "prompt must be a string or a list", "BadRequestError"))
                n = self._max_tokens(body, "max_tokens")
            prompt = self._token_ids(body)  # as the gateway's precise-prefix reads it
        except _BadRequest as bad:
            return bad.response
        options = body.get("stream_options") or {}
        usage = bool(isinstance(options, dict) and options.get("include_usage"))
        return await self._serve(body, prompt, n, lambda seq: self._complete(body["model"], chat, seq),
                                 lambda seq: self._stream(request, body["model"], chat, seq, usage))

    async def _serve(self, body: dict[str, Any], prompt: list[int], n: int,
                     whole: Callable[[Seq], dict[str, Any]],
                     stream: Callable[[Seq], Awaitable[web.StreamResponse]]) -> web.StreamResponse:
        """Generate n tokens after `prompt`: streamed (`stream` relays them) or `whole` when all are made."""
        self._admit()
        adapter = self._adapter(body["model"])
        lora_id = self.lora_ids.get(adapter)
        salt = body.get("cache_salt")
        seq = Seq(prompt, n, None if lora_id is None else (adapter, lora_id), salt if isinstance(salt, str) and salt
                  else None)
        if self.scheduler is None:
            seq.cached = self.cache.admit(prompt, seq.lora, seq.salt)
        held = len(prompt) + n
        self.running += 1
        self.held_tokens += held
        self.prompt_tokens += len(prompt)
        try:
            if body.get("stream"):
                return await stream(seq)
            if self.scheduler is not None:
                async for _ in self.scheduler.generate(seq):
                    pass
            else:
                await self.pacer.wait_all(n)
            self.generation_tokens += n
            self.succeeded += 1
            return web.Response(body=json.dumps(whole(seq)).encode(), content_type=JSON)
        finally:
            self.running -= 1
            self.held_tokens -= held

    def _ticks(self, seq: Seq) -> AsyncGenerator[int, None]:
        """The indices of a request's tokens, each when it is due."""
        if self.scheduler is not None:
            return self.scheduler.generate(seq)
        return self.pacer.ticks(seq.n)

    def _complete(self, model: str, chat: bool, seq: Seq) -> dict[str, Any]:
        n = seq.n
        usage = _usage(seq)
        if chat:
            choice = {"index": 0, "message": {"role": "assistant", "content": tokens.text(n)},
                      "logprobs": None, "finish_reason": "length"}
            kind, prefix = "chat.completion", "chatcmpl"
        else:
            choice = {"index": 0, "text": tokens.text(n), "logprobs": None, "finish_reason": "length"}
            kind, prefix = "text_completion", "cmpl"
        return {"id": self._id(prefix), "object": kind, "created": int(time.time()), "model": model,
                "choices": [choice], "usage": usage}

    async def _stream(self, request: web.Request, model: str, chat: bool, seq: Seq,
                      include_usage: bool) -> web.StreamResponse:
        n = seq.n
        kind, prefix = ("chat.completion.chunk", "chatcmpl") if chat else ("text_completion", "cmpl")
        head = {"id": self._id(prefix), "object": kind, "created": int(time.time()), "model": model}

        def chunk(choices: list[dict[str, Any]], **extra: Any) -> bytes:
            obj = {**head, "choices": choices, **extra}
            if include_usage and "usage" not in extra:
                obj["usage"] = None
            return sse(obj)

        def token_chunk(i: int) -> bytes:
            finish = "length" if i == n - 1 else None
            if chat:
                choice = {"index": 0, "delta": {"content": tokens.token(i)}, "logprobs": None, "finish_reason": finish}
            else:
                choice = {"index": 0, "text": tokens.token(i), "logprobs": None, "finish_reason": finish}
            return chunk([choice])

        def tail() -> bytes:
            out = b""
            if include_usage:
                out += chunk([], usage=_usage(seq))
            return out + DONE

        first = b""
        if chat:
            first = chunk([{"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
                            "finish_reason": None}])
        return await self._relay(request, seq, first, token_chunk, tail)

    async def _relay(self, request: web.Request, seq: Seq, first: bytes, token_chunk: Callable[[int], bytes],
                     tail: Callable[[], bytes]) -> web.StreamResponse:
        """A stream of server-sent events: `first`, then each token's event when it is due, then `tail()`."""
        n = seq.n
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        await response.prepare(request)
        ticks = None
        try:
            if self.scheduler is None and self.pacer.instant:
                await response.write(first + b"".join(token_chunk(i) for i in range(n)) + tail())
                self.generation_tokens += n
            else:
                # The role's chunk goes with the first token, as vLLM's does: a stream's first
                # chunk marks its time to first token.
                ticks = self._ticks(seq)
                async for i in ticks:
                    await response.write(first + token_chunk(i))
                    first = b""
                    self.generation_tokens += 1
                await response.write(first + tail())
            await response.write_eof()
        except ConnectionError:
            return response  # the client went away; nothing to finish
        finally:
            if ticks is not None:
                await ticks.aclose()  # a request the client left stops taking a running slot
        self.succeeded += 1
        return response


    # ------------------------------------------------------- more endpoints

    async def responses(self, request: web.Request) -> web.StreamResponse:
        """The Responses API, as vLLM serves it: a stored response (`store`, the default) stays in
        this engine's memory; a `previous_response_id` it does not hold is a 404."""
        try:
            body = await self._body(request)
            given = body.get("input")
            if not isinstance(given, (str, list)):
                raise _BadRequest(error(400, "input must be a string or a list of items", "BadRequestError"))
            n = self._max_tokens(body, "max_output_tokens")
            prompt = self._token_ids({"messages": given} if isinstance(given, list) else {"prompt": given})
        except _BadRequest as bad:
            return bad.response
        previous = body.get("previous_response_id")
        if previous is not None and previous not in self.stored:
            return error(404, f"Response with id '{previous}' not found.", "invalid_request_error",
                         "previous_response_id")
        head = {"id": self._id("resp"), "object": "response", "created_at": int(time.time()),
                "model": body["model"], "previous_response_id": previous, "store": body.get("store", True) is not False,
                "parallel_tool_calls": True, "tool_choice": "auto", "tools": [], "error": None,
                "incomplete_details": None, "instructions": body.get("instructions"), "metadata": {}}
        message_id = self._id("msg")

        def made(seq: Seq) -> dict[str, Any]:
            usage = _usage(seq)
            text = {"type": "output_text", "text": tokens.text(seq.n), "annotations": [], "logprobs": []}
            message = {"type": "message", "id": message_id, "role": "assistant", "status": "completed",
                       "content": [text]}
            response = {**head, "status": "completed", "output": [message], "usage": {
                "input_tokens": usage["prompt_tokens"], "output_tokens": usage["completion_tokens"],
                "total_tokens": usage["total_tokens"], "input_tokens_details": {"cached_tokens": seq.cached},
                "output_tokens_details": {"reasoning_tokens": 0}}}
            if response["store"]:
                self.stored[response["id"]] = response
            return response

        def stream(seq: Seq) -> Awaitable[web.StreamResponse]:
            numbers = itertools.count()

            def event(kind: str, **fields: Any) -> bytes:
                data = {"type": kind, "sequence_number": next(numbers), **fields}
                return f"event: {kind}\n".encode() + sse(data)

            part = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
            where = {"item_id": message_id, "output_index": 0, "content_index": 0}
            first = (event("response.created", response={**head, "status": "in_progress", "output": []})
                     + event("response.output_item.added", output_index=0, item={
                         "type": "message", "id": message_id, "role": "assistant", "status": "in_progress",
                         "content": []})
                     + event("response.content_part.added", part=part, **where))

            def token_event(i: int) -> bytes:
                return event("response.output_text.delta", delta=tokens.token(i), logprobs=[], **where)

            def tail() -> bytes:
                response = made(seq)
                message = response["output"][0]
                return (event("response.output_text.done", text=message["content"][0]["text"], logprobs=[], **where)
                        + event("response.content_part.done", part=message["content"][0], **where)
                        + event("response.output_item.done", output_index=0, item=message)
                        + event("response.completed", response=response))
            return self._relay(request, seq, first, token_event, tail)

        return await self._serve(body, prompt, n, made, stream)

    async def retrieve(self, request: web.Request) -> web.Response:
        """A stored response, by id (vLLM's GET /v1/responses/{response_id})."""
        response_id = request.match_info["response_id"]
        stored = self.stored.get(response_id)
        if stored is None:
            return error(404, f"Response with id '{response_id}' not found.", "invalid_request_error", "response_id")
        return web.json_response(stored)

    async def tokenize(self, request: web.Request) -> web.Response:
        """vLLM's /tokenize: a prompt's (or a chat's) token ids and their count."""
        try:
            body = await self._body(request)
            ids = self._token_ids(body)
        except _BadRequest as bad:
            return bad.response
        return web.json_response({"count": len(ids), "max_model_len": self.cfg.kv_cache_tokens, "tokens": ids,
                                  "token_strs": None})

    async def detokenize(self, request: web.Request) -> web.Response:
        """vLLM's /detokenize: the text of token ids (without a tokenizer, fake words)."""
        try:
            body = await self._body(request)
        except _BadRequest as bad:
            return bad.response
        ids = body.get("tokens")
        if not isinstance(ids, list) or not all(isinstance(i, int) and not isinstance(i, bool) for i in ids):
            return error(400, "tokens must be a list of integers", "BadRequestError")
        text = self.tokenizer.decode(ids) if self.tokenizer is not None else "".join(tokens.token(i) for i in ids)
        return web.json_response({"prompt": text})

    async def rerank(self, request: web.Request) -> web.Response:
        """vLLM's /rerank (Jina's shape): the documents by the share of the query's words each has."""
        try:
            body = await self._body(request)
        except _BadRequest as bad:
            return bad.response
        query, documents = body.get("query"), body.get("documents")
        if not isinstance(query, str) or not isinstance(documents, list) or not all(
                isinstance(d, str) for d in documents):
            return error(400, "query must be a string and documents a list of strings", "BadRequestError")
        words = set(query.lower().split())
        results = [{"index": i, "document": {"text": d},
                    "relevance_score": len(words & set(d.lower().split())) / (len(words) or 1)}
                   for i, d in enumerate(documents)]
        results.sort(key=lambda r: -float(r["relevance_score"]))  # type: ignore[arg-type]
        top_n = body.get("top_n")
        if isinstance(top_n, int) and top_n > 0:
            results = results[:top_n]
        n = sum(len(text.split()) or 1 for text in (query, *documents))
        return web.json_response({"id": self._id("rerank"), "model": body["model"],
                                  "usage": {"prompt_tokens": n, "total_tokens": n}, "results": results})

    async def _inputs(self, request: web.Request) -> tuple[dict[str, Any], list[str]] | web.Response:
        """A pooling request's body and its `input` as a list of strings."""
        try:
            body = await self._body(request)
        except _BadRequest as bad:
            return bad.response
        inputs = body.get("input")
        inputs = [inputs] if isinstance(inputs, str) else inputs
        if not isinstance(inputs, list) or not inputs or not all(isinstance(t, str) for t in inputs):
            return error(400, "input must be a string or a list of strings", "BadRequestError", "input")
        return body, inputs

    def _pooled(self, body: dict[str, Any], inputs: list[str], kind: str,
                item: Callable[[int, str], dict[str, Any]]) -> web.Response:
        n = sum(len(t.split()) or 1 for t in inputs)
        return web.json_response({"id": self._id(kind), "object": "list", "created": int(time.time()),
                                  "model": body["model"], "data": [item(i, t) for i, t in enumerate(inputs)],
                                  "usage": {"prompt_tokens": n, "total_tokens": n}})

    async def pooling(self, request: web.Request) -> web.Response:
        """vLLM's /pooling: each input's pooled vector (here: its words and characters counted)."""
        got = await self._inputs(request)
        if isinstance(got, web.Response):
            return got
        return self._pooled(*got, "pool", lambda i, t: {"index": i, "object": "pooling",
                                                         "data": [float(len(t.split())), float(len(t))]})

    async def classify(self, request: web.Request) -> web.Response:
        """vLLM's /classify: each input's label (here: LABEL_1 for an odd number of words)."""
        got = await self._inputs(request)
        if isinstance(got, web.Response):
            return got

        def label(i: int, text: str) -> dict[str, Any]:
            odd = len(text.split()) % 2
            return {"index": i, "label": f"LABEL_{odd}", "probs": [1.0 - odd, float(odd)], "num_classes": 2}
        return self._pooled(*got, "classify", label)

    async def transcribe(self, request: web.Request) -> web.Response:
        """vLLM's /v1/audio/transcriptions and /translations: a multipart form with `file` and
        `model`; the text says how many bytes the file had, and its name."""
        unavailable = self._unavailable()
        if unavailable is not None:
            return unavailable
        try:
            form = await request.post()
        except ValueError as err:
            return error(400, f"the body is not a form: {err}", "BadRequestError")
        upload = form.get("file")
        if not isinstance(upload, web.FileField):
            return error(422, "file: a file upload is required", "BadRequestError", "file")
        try:
            self._serves(form.get("model"))
        except _BadRequest as bad:
            return bad.response
        text = f"{len(upload.file.read())} bytes of {upload.filename}"
        if form.get("response_format") == "text":
            return web.Response(text=text)
        return web.json_response({"text": text, "usage": {"type": "duration", "seconds": 1}})


def _usage(seq: Seq) -> dict[str, Any]:
    prompt, n = len(seq.tokens), seq.n
    return {"prompt_tokens": prompt, "completion_tokens": n, "total_tokens": prompt + n,
            "prompt_tokens_details": {"cached_tokens": seq.cached}}

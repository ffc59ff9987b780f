"""Will it fit, before the pull: a pulled source's Shape (llmgw/fit.py) from the few bytes that say it.

The source's listing is the puller's own (llmgw/weights/resolve.py: the hub's model info at the
revision, or an HTTP origin's manifest.json), so the same files, URLs, token and endpoint
(HF_ENDPOINT) are read. Then, by HTTP Range reads and nothing more:

- of each `*.safetensors` file its first 8 bytes (the header's length), then the header;
- `config.json` whole (it is small), and `model.safetensors.index.json` where there is one (only
  the files it names count, as vLLM loads only those);
- of a GGUF file (a source without safetensors, holding one) its first MiB, then twice as much
  until the metadata and tensor infos are all in it (a large vocabulary makes them some MiB).

An origin that answers a Range read with more than the range (200, not 206) is refused: reading
on would pull the weights.
"""
from __future__ import annotations

import asyncio
import dataclasses
import tempfile
from collections.abc import Callable
from pathlib import Path

import aiohttp

from llmgw.api.sources import PulledSource, default_hub, parse_source
from llmgw.fit import (
    INDEX,
    MAX_HEADER,
    IncompleteGGUF,
    Shape,
    ShapeError,
    gguf_shape,
    header_length,
    header_tensor_bytes,
    indexed,
    parse_config,
    read_shape,
    shape_of,
)
from llmgw.weights.digest import FileEntry
from llmgw.weights.errors import PullError
from llmgw.weights.resolve import HubConfig, resolve

GGUF_FIRST_READ = 1 << 20
TIMEOUT = aiohttp.ClientTimeout(total=60)


async def _range(http: aiohttp.ClientSession, entry: FileEntry, headers: dict[str, str], start: int,
                 length: int) -> bytes:
    where = f"{entry.url} bytes {start}-{start + length - 1}"
    ask = {**headers, "Range": f"bytes={start}-{start + length - 1}"}

    def partial(resp: aiohttp.ClientResponse) -> bool:   # a file no longer than the range may come whole
        return resp.status == 206 or (resp.status == 200 and resp.content_length is not None
                                      and resp.content_length <= length)
    return await _read(http, entry.url, ask, length, partial, where, "not 206 Partial Content (no Range reads there)")


async def _get(http: aiohttp.ClientSession, entry: FileEntry, headers: dict[str, str]) -> bytes:
    """A small file whole (config.json, the safetensors index)."""
    return await _read(http, entry.url, headers, MAX_HEADER, lambda resp: resp.status == 200, entry.url, "")


async def _read(http: aiohttp.ClientSession, url: str, headers: dict[str, str], most: int,
                answered: Callable[[aiohttp.ClientResponse], bool], where: str, why: str) -> bytes:
    """At most `most` bytes of `url`'s answer, if `answered` takes it; ShapeError naming `where` else."""
    try:
        async with http.get(url, headers=headers) as resp:
            if not answered(resp):
                raise ShapeError(f"{where}: HTTP {resp.status}" + (f", {why}" if why else ""))
            return await resp.content.read(most)
    except (aiohttp.ClientError, asyncio.TimeoutError) as err:
        raise ShapeError(f"{where}: {type(err).__name__}: {err}") from None


async def _safetensors_bytes(http: aiohttp.ClientSession, entry: FileEntry, headers: dict[str, str]) -> int:
    length = header_length(await _range(http, entry, headers, 0, 8), entry.url)
    return header_tensor_bytes(await _range(http, entry, headers, 8, length), entry.url)


async def _gguf(http: aiohttp.ClientSession, entry: FileEntry, headers: dict[str, str]) -> Shape:
    with tempfile.TemporaryDirectory(prefix="llmgw-fit-") as tmp:
        copy = Path(tmp) / Path(entry.path).name      # the first bytes, then a hole of the file's size
        read = 0
        want = GGUF_FIRST_READ
        while True:
            chunk = await _range(http, entry, headers, read, min(want, entry.size) - read)
            with copy.open("r+b" if read else "wb") as f:
                f.seek(read)
                f.write(chunk)
                f.truncate(entry.size)
            read += len(chunk)
            try:
                return await asyncio.to_thread(gguf_shape, copy, read)
            except IncompleteGGUF:
                if read >= min(entry.size, MAX_HEADER):
                    raise ShapeError(f"{entry.url}: no GGUF metadata in its first {read} bytes") from None
                want = 2 * read


async def read_pulled(source: PulledSource, hub: HubConfig) -> Shape:
    """The Shape of a pulled source, from its listing and Range reads of its files' heads."""
    async with aiohttp.ClientSession(timeout=TIMEOUT) as http:
        try:
            listing = await resolve(source, http, hub)
        except PullError as err:
            raise ShapeError(str(err)) from None
        files = {f.path: f for f in listing.files}
        shards = [f for p, f in sorted(files.items()) if p.endswith(".safetensors") and "/" not in p]
        ggufs = [f for p, f in sorted(files.items()) if p.endswith(".gguf")]
        if not shards and len(ggufs) == 1:
            return await _gguf(http, ggufs[0], listing.headers)
        if not shards:
            raise ShapeError(f"{source.text}: no *.safetensors files and no single GGUF file "
                             f"({len(ggufs)} *.gguf)")
        config = files.get("config.json")
        if config is None:
            raise ShapeError(f"{source.text}: no config.json")
        index = files.get(INDEX)
        if index is not None:
            shards = [files[p] for p in indexed([f.path for f in shards], await _get(http, index, listing.headers),
                                                index.url)]
        raw = await _get(http, config, listing.headers)
        shape = shape_of(parse_config(raw, config.url), 0, config.url)
        sizes = await asyncio.gather(*(_safetensors_bytes(http, f, listing.headers) for f in shards))
        return dataclasses.replace(shape, weight_bytes=sum(sizes))


def read_source(source: str, hub: HubConfig | None = None) -> Shape:
    """The Shape of a Model's spec.source: a local directory or GGUF file, or a pulled source read
    before the pull (hf:// at HF_ENDPOINT unless `hub` says otherwise)."""
    try:
        pulled = parse_source(source)
    except ValueError as err:
        raise ShapeError(str(err)) from None
    if pulled is None:
        if not Path(source).exists():
            raise ShapeError(f"{source}: no such directory or file here")
        return read_shape(Path(source))
    return asyncio.run(read_pulled(pulled, hub or HubConfig(endpoint=default_hub())))


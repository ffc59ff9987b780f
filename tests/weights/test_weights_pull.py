"""Pulls into the weights cache from real HTTP origins on loopback (tests/fixtures/weights_origin.py):
a hub speaking the endpoints huggingface_hub calls, and a plain origin with a manifest."""
from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest

from llmgw.api.sources import parse_source
from llmgw.weights.cache import Cache
from llmgw.weights.errors import PullError
from llmgw.weights.puller import Puller
from llmgw.weights.resolve import HubConfig
from tests.fixtures.weights_origin import WeightsOrigin, content_digest, generated, origin  # noqa: F401

FILES = {"config.json": 300, "model-00001.safetensors": 200_000, "sub/tokenizer.json": 5_000}


def puller(tmp_path: Path, origin: WeightsOrigin, capacity: int | None = None) -> Puller:
    cache = Cache(tmp_path / "cache", capacity)
    cache.open()
    return Puller(cache, HubConfig(endpoint=origin.url))


async def pull(p: Puller, source: str, pin: str | None = None):
    src = parse_source(source)
    assert src is not None
    return await p.pull(src, pin).task


async def test_hub_model_is_pulled_verified_and_read_only(tmp_path, origin):
    files = generated(1, FILES)
    commit = origin.add_repo("org/tiny", files)
    p = puller(tmp_path, origin)
    got = await pull(p, "hf://org/tiny")
    assert got.digest == content_digest(files)
    for path, data in files.items():
        assert (got.path / path).read_bytes() == data
        assert not os.access(got.path / path, os.W_OK) or os.geteuid() == 0
    assert p.cache.status().models[0].digest == got.digest
    # Pulled again at its commit: the cache answers, no file is fetched again.
    fetched = len(origin.requests(suffix=".safetensors"))
    again = await pull(p, f"hf://org/tiny@{commit}")
    assert again == got
    assert len(origin.requests(suffix=".safetensors")) == fetched
    await p.close()


async def test_corrupted_byte_is_detected_and_never_cached(tmp_path, origin):
    files = generated(2, FILES)
    url = origin.add_dir("m", files)
    origin.corrupt("m/model-00001.safetensors")
    p = puller(tmp_path, origin)
    with pytest.raises(PullError) as err:
        await pull(p, url)
    assert err.value.reason == "ChecksumMismatch"
    assert "model-00001.safetensors" in err.value.message
    assert list(p.cache.models.iterdir()) == [] and list(p.cache.partials.iterdir()) == []
    # The same from the hub, where small files are checked by their git blob id.
    origin.add_repo("org/c", files)
    origin.corrupt("org/c/config.json")
    with pytest.raises(PullError) as err:
        await pull(p, "hf://org/c")
    assert err.value.reason == "ChecksumMismatch" and "git blob id" in err.value.message
    assert list(p.cache.models.iterdir()) == []
    await p.close()


async def test_interrupted_fetch_resumes_with_a_range_request(tmp_path, origin):
    files = generated(3, FILES)
    origin.add_repo("org/r", files)
    origin.drop_after("org/r/model-00001.safetensors", 70_000)
    p = puller(tmp_path, origin)
    got = await pull(p, "hf://org/r")
    assert (got.path / "model-00001.safetensors").read_bytes() == files["model-00001.safetensors"]
    gets = origin.requests(suffix="model-00001.safetensors")
    assert [g.range for g in gets][0] is None
    resumed = [g.range for g in gets if g.range]
    assert resumed and int(resumed[0].removeprefix("bytes=").rstrip("-")) >= 60_000, gets
    await p.close()


async def test_pinned_digest_mismatch_fails_before_anything_is_cached(tmp_path, origin):
    url = origin.add_dir("m", generated(4, FILES))
    p = puller(tmp_path, origin)
    with pytest.raises(PullError) as err:
        await pull(p, url, pin="sha256:" + "0" * 64)
    assert err.value.reason == "DigestMismatch"
    assert origin.requests(suffix=".safetensors") == []
    await p.close()


async def test_full_cache_evicts_only_unused_models(tmp_path, origin):
    a = origin.add_dir("a", generated(5, {"w.bin": 400_000}))
    b = origin.add_dir("b", generated(6, {"w.bin": 400_000}))
    c = origin.add_dir("c", generated(7, {"w.bin": 400_000}))
    p = puller(tmp_path, origin, capacity=900_000)
    got_a = await pull(p, a)
    got_b = await pull(p, b)
    p.cache.pin(got_b.digest)               # a shard of this node runs b; a is unused
    got_c = await pull(p, c)
    assert not p.cache.has(got_a.digest) and p.cache.has(got_b.digest) and p.cache.has(got_c.digest)
    assert not got_a.path.exists()
    p.cache.pin(got_c.digest)               # now both are in use: a cannot come back
    with pytest.raises(PullError) as err:
        await pull(p, a)
    assert err.value.reason == "CacheFull"
    assert got_b.digest in err.value.message and got_c.digest in err.value.message
    await p.close()


async def test_origin_unreachable_and_unknown_repo_are_clear(tmp_path, origin):
    p = puller(tmp_path, origin)
    with pytest.raises(PullError) as err:
        await pull(p, "hf://org/none")
    assert err.value.reason == "SourceNotFound"
    await origin.stop()
    with pytest.raises(PullError) as err:
        await pull(p, f"{origin.url}/models/gone/")
    assert err.value.reason == "OriginUnreachable"
    await p.close()


async def test_a_hub_revision_is_known_as_its_commit_before_its_files_arrive(tmp_path, origin):
    commit = origin.add_repo("org/slow", generated(9, FILES))
    origin.rate = 1e6                   # the files take a while: the commit is known long before
    p = puller(tmp_path, origin)
    src = parse_source("hf://org/slow")
    assert src is not None
    pull = p.pull(src, None)
    while pull.progress.resolved is None:
        await asyncio.sleep(0.01)
    assert pull.progress.resolved == f"hf://org/slow@{commit}" and pull.progress.done < pull.progress.total
    assert (await pull.task).resolved == f"hf://org/slow@{commit}"
    await p.close()


async def test_shards_wanting_one_source_share_one_pull(tmp_path, origin):
    files = generated(8, FILES)
    origin.add_repo("org/s", files)
    p = puller(tmp_path, origin)
    src = parse_source("hf://org/s")
    assert src is not None
    first, second = p.pull(src, None), p.pull(src, None)
    assert first is second
    await asyncio.gather(first.task)
    assert first.progress.done == first.progress.total == sum(len(d) for d in files.values())
    assert len(origin.requests(suffix=".safetensors")) == 1
    await p.close()

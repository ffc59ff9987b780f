"""llmgw.api.limits: the bounds every input path shares (parse_json here; manifests in the corpus)."""
from __future__ import annotations

import json

import pytest

from llmgw.api import load_file
from llmgw.api.limits import MAX_DEPTH, InputError, parse_json
from llmgw.api.manifests import ManifestError


def nested(depth: int) -> str:
    return "[" * depth + "]" * depth


@pytest.mark.parametrize("unique_keys", [True, False])
def test_nesting_is_bounded_at_max_depth_exactly(unique_keys):
    assert parse_json(nested(MAX_DEPTH), unique_keys=unique_keys)
    with pytest.raises(InputError) as err:
        parse_json(nested(MAX_DEPTH + 1), unique_keys=unique_keys)
    assert err.value.message == f"nested deeper than {MAX_DEPTH} levels"
    with pytest.raises(InputError):  # past the interpreter's recursion limit: still an InputError
        parse_json(nested(100_000), unique_keys=unique_keys)


def test_duplicate_keys_are_refused_only_where_asked_for():
    body = '{"model": "a", "options": {"n": 1, "n": 2}}'
    with pytest.raises(InputError) as err:
        parse_json(body)
    assert str(err.value) == "options.n: duplicate key"
    assert parse_json(body, unique_keys=False)["options"] == {"n": 2}  # the gateway passes bodies on


def test_a_large_flat_body_is_not_counted_against_yaml_alias_limits():
    # 200 lists of 1000 token ids: an embeddings request the gateway must pass
    body = json.dumps({"model": "e", "input": [[7] * 1000 for _ in range(200)]})
    assert len(parse_json(body, unique_keys=False)["input"]) == 200


def test_a_yaml_alias_bomb_is_refused_before_validation(tmp_path):
    lines = ["a0: &a0 [x, x, x, x, x, x, x, x, x, x]"]
    lines += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 10)}]" for i in range(1, 8)]
    path = tmp_path / "bomb.yaml"
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(ManifestError) as err:
        load_file(path)
    assert str(err.value) == f"{path}: document 0: <document>: more than 100000 values (YAML aliases expanded)"


def test_a_yaml_merge_key_may_be_overridden(tmp_path):
    path = tmp_path / "merge.yaml"
    path.write_text("apiVersion: llmgw.io/v1\nkind: Model\nmetadata: {name: m}\n"
                    "spec:\n  <<: {replicas: 1, profiles: [{engine: sim}]}\n  replicas: 3\n")
    (model,) = load_file(path)
    assert model.spec.replicas == 3

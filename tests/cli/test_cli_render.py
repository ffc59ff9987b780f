"""Output formats, `describe` text and the manifest diff, on real API objects."""
from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone

import yaml

from llmgw.api import parse_object
from llmgw.cli.diff import unified_diff
from llmgw.printers.describe import describe
from llmgw.printers.objects import format_objects

NOW = datetime(2024, 5, 1, 12, 0, 0, tzinfo=timezone.utc)


def model(name="llama", replicas=2, labels=None, **extra):
    return parse_object({
        "apiVersion": "llmgw.io/v1", "kind": "Model",
        "metadata": {"name": name, "labels": labels or {"app": "chat"},
                     "creationTimestamp": (NOW - timedelta(minutes=5)).isoformat(), "generation": 3,
                     "resourceVersion": 41, **extra},
        "spec": {"replicas": replicas, "aliases": ["l3"], "profiles": [{"engine": "sim"}]},
        "status": {"readyReplicas": 1, "conditions": [
            {"type": "Available", "status": "False", "reason": "MinimumReplicasUnavailable",
             "message": "1/2 replicas ready", "lastTransitionTime": (NOW - timedelta(seconds=30)).isoformat()}]},
    })


def test_yaml_json_name_outputs_parse_back():
    a, b = model("a"), model("b")
    one = yaml.safe_load(format_objects([a], "yaml", single=True))
    assert parse_object(one) == a
    many = json.loads(format_objects([a, b], "json", single=False))
    assert many["kind"] == "List" and [parse_object(i).name for i in many["items"]] == ["a", "b"]
    assert format_objects([a, b], "name", single=False) == "model/a\nmodel/b"


def test_describe_shows_spec_status_conditions_and_events():
    text = describe(model(), events=[{"type": "Normal", "reason": "ScaledUp", "message": "created replica llama-x",
                                      "lastTimestamp": (NOW - timedelta(seconds=12)).isoformat()}],
                    extra=["Replicas:", "  llama-x"], now=NOW)
    lines = text.splitlines()
    assert lines[0].split() == ["Name:", "llama"]
    assert "Labels:       app=chat" in lines
    assert "Created:      2024-05-01T11:55:00+00:00 (5m ago)" in lines
    spec = lines.index("Spec:")
    assert "  replicas: 2" in lines[spec:] and "  - l3" in lines[spec:]
    status = lines.index("Status:")
    assert "  readyReplicas: 1" in lines[status:]
    cond = lines.index("Conditions:")
    assert lines[cond + 1].split() == ["TYPE", "STATUS", "REASON", "AGE", "MESSAGE"]
    assert lines[cond + 2].split() == ["Available", "False", "MinimumReplicasUnavailable", "30s", "1/2", "replicas",
                                       "ready"]
    assert "Replicas:" in lines and lines.index("Replicas:") < lines.index("Events:")
    ev = lines.index("Events:")
    assert lines[ev + 2].split() == ["Normal", "ScaledUp", "12s", "created", "replica", "llama-x"]


def test_describe_without_events_or_conditions_says_none():
    m = model()
    m.status.conditions = []
    lines = describe(m, now=NOW).splitlines()
    assert lines[lines.index("Conditions:") + 1] == "  <none>"
    assert lines[lines.index("Events:") + 1] == "  <none>"


def test_diff_covers_spec_and_labels_only():
    live = model(replicas=2)
    same = model(replicas=2, labels={"app": "chat"})
    same.metadata.resourceVersion = None      # server-side fields are not compared
    same.status.readyReplicas = 0
    assert unified_diff(live, same) == ""

    changed = model(replicas=3, labels={"app": "chat", "team": "ml"})
    text = unified_diff(live, changed)
    assert text.startswith("--- live/model/llama\n+++ manifest/model/llama\n")
    body = text.splitlines()
    assert "-  replicas: 2" in body and "+  replicas: 3" in body
    assert "+    team: ml" in body
    assert not any(line.startswith(("-", "+")) and "readyReplicas" in line for line in body)

    # labels a controller added to the live object are kept by apply, so they are no difference
    live.metadata.labels["llmgw.io/managed"] = "yes"
    assert unified_diff(live, same) == ""


def test_diff_of_a_new_object_is_all_additions():
    text = unified_diff(None, model())
    lines = text.splitlines()
    assert lines[0] == "--- /dev/null" and lines[1] == "+++ manifest/model/llama"
    assert all(line.startswith(("+", "@")) for line in lines[2:])

"""The event recorder: deduplication, and drops counted and logged once per interval when the
store falls behind (one log line per dropped event flooded a 10,000-node run's log)."""
from __future__ import annotations

import logging

import pytest

from llmgw.api import Model
from llmgw.runtime.events import DROP_LOG_SECONDS, EventRecorder


def model(name: str) -> Model:
    return Model.model_validate({"metadata": {"name": name}, "spec": {"profiles": [{"engine": "sim"}]}})


async def test_an_identical_event_within_the_window_is_recorded_once():
    now = [0.0]
    rec = EventRecorder(dedup_seconds=30, clock=lambda: now[0])
    rec.record(model("a"), "Normal", "Created", "x")
    rec.record(model("a"), "Normal", "Created", "x")
    now[0] = 31.0
    rec.record(model("a"), "Normal", "Created", "x")
    assert len(rec.find(name="a")) == 2


async def test_drops_are_counted_and_logged_once_per_interval(caplog: pytest.LogCaptureFixture):
    now = [0.0]
    rec = EventRecorder(queue_limit=1, clock=lambda: now[0])
    with caplog.at_level(logging.WARNING, logger="llmgw.events"):
        for i in range(50):
            rec.record(model(f"m{i}"), "Normal", "Created", "x")     # the first fits; 49 dropped
        now[0] = DROP_LOG_SECONDS
        rec.record(model("late"), "Normal", "Created", "x")
    lines = [r.getMessage() for r in caplog.records if "queue full" in r.getMessage()]
    assert rec.dropped == 50
    assert lines == ["event queue full: dropped 1 event(s) since the last report, the latest models/m1 Created",
                     "event queue full: dropped 49 event(s) since the last report, the latest models/late Created"]

"""usage.py without processes: the last minute's and hour's figures slide with a clock, counts since
start stay, the last use is reported, and a report of many keys is bounded (most recent first); the
server's sum over gateways (llmgw/api/usage.py's total_usage)."""
from __future__ import annotations

import json

from llmgw.api import ApiKey
from llmgw.api.secrets import hash_secret
from llmgw.api.usage import UsageReport, total_usage
from llmgw.gateway.admission import Admission, Ticket
from llmgw.gateway.usage import MAX_REPORT_BYTES, PERIOD, UsageWindows

_HASH = hash_secret("llmgw_k_" + "0" * 48, n=2)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _key(name: str, **limits: int) -> ApiKey:
    return ApiKey.model_validate({"kind": "ApiKey", "metadata": {"name": name},
                                  "spec": {"owner": "o", "secretHash": _HASH, "limits": limits}})


def test_windows_slide_and_totals_stay():
    admission, clock = Admission(lambda m: {}, lambda n: n), Clock()
    windows = UsageWindows(admission._usage, admission.last_used, clock)
    k = _key("k")
    assert windows.report() == {}   # no key used: nothing reported
    clock.now += PERIOD
    for _ in range(3):
        ticket = admission.admit(k, "m", lambda: None)
        assert isinstance(ticket, Ticket)
        ticket.used((10, 2))
        ticket.release()
    first = windows.report()
    ticket = admission.admit(k, "m", lambda: None)
    assert windows.report() is first   # made again only PERIOD s later
    assert isinstance(ticket, Ticket)
    ticket.release()
    assert first["k"]["models"]["m"] == {
        "total": {"requests": 3, "promptTokens": 30, "completionTokens": 6},
        "lastMinute": {"requests": 3, "promptTokens": 30, "completionTokens": 6},
        "lastHour": {"requests": 3, "promptTokens": 30, "completionTokens": 6}}
    assert first["k"]["lastUsed"].endswith("+00:00")
    clock.now += 30
    ticket = admission.admit(k, "m", lambda: None)
    assert isinstance(ticket, Ticket)
    assert windows.report()["k"]["models"]["m"]["lastMinute"] == {"requests": 5, "promptTokens": 30,
                                                                   "completionTokens": 6}
    clock.now += 45   # the first three are over a minute old; the two counted at +30 s are not
    m = windows.report()["k"]["models"]["m"]
    assert m["lastMinute"] == {"requests": 2} and m["lastHour"]["requests"] == 5 and m["total"]["requests"] == 5
    clock.now += 3600   # over an hour: only the totals are left
    assert windows.report()["k"]["models"]["m"] == {
        "total": {"requests": 5, "promptTokens": 30, "completionTokens": 6}}


def test_refusals_count_as_use_and_are_reported():
    admission = Admission(lambda m: {}, lambda n: n)
    windows = UsageWindows(admission._usage, admission.last_used, Clock())
    k = _key("k", requestsPerMinute=1)
    assert isinstance(admission.admit(k, "m", lambda: None), Ticket)
    assert not isinstance(admission.admit(k, "m", lambda: None), Ticket)
    admission.refused("k", "m")   # as the proxy counts a 429
    assert windows.report()["k"]["models"]["m"]["total"] == {"requests": 1, "rateLimited": 1}


def test_a_report_of_many_keys_is_bounded_most_recent_first():
    admission = Admission(lambda m: {}, lambda n: n)
    windows = UsageWindows(admission._usage, admission.last_used, Clock())
    n = 5000
    for i in range(n):
        name = f"key-with-a-longish-name-{i:05d}"
        admission.usage(name, "some-model")[0] = 1
        admission.last_used[name] = 1e9 + i   # the later i, the more recent
    report = windows.report()
    assert 0 < len(report) < n
    assert len(json.dumps(report)) <= MAX_REPORT_BYTES
    assert f"key-with-a-longish-name-{n - 1:05d}" in report and "key-with-a-longish-name-00000" not in report
    UsageReport.model_validate({"gateway": "g", "keys": report})   # what the server accepts


def test_the_sum_over_gateways_adds_figures_and_keeps_the_latest_use():
    a = UsageReport.model_validate({"gateway": "a", "keys": {"k": {
        "lastUsed": "2026-12-05T10:00:00+00:00",
        "models": {"m": {"total": {"requests": 3, "promptTokens": 30}, "lastMinute": {"requests": 1}}}}}})
    b = UsageReport.model_validate({"gateway": "b", "keys": {
        "k": {"lastUsed": "2026-12-05T11:00:00+00:00",
              "models": {"m": {"total": {"requests": 2, "completionTokens": 5}},
                         "n": {"total": {"requests": 1}}}},
        "other": {"models": {}}}})
    total = total_usage([a, b])
    assert total["k"].lastUsed is not None and total["k"].lastUsed.hour == 11
    assert total["k"].models["m"].total.requests == 5 and total["k"].models["m"].total.promptTokens == 30
    assert total["k"].models["m"].total.completionTokens == 5 and total["k"].models["m"].lastMinute.requests == 1
    assert total["k"].models["n"].total.requests == 1 and total["other"].lastUsed is None
    assert a.keys["k"].models["m"].total.requests == 3   # the reports themselves are not changed

"""admission.py's arithmetic, without processes: each gateway's share of a key's limits, concurrency
rounded up, buckets resized when the gateways change, a revoked key's requests ended, reset times."""
from __future__ import annotations

from llmgw.api import ApiKey
from llmgw.api.secrets import hash_secret
from llmgw.gateway.admission import Admission, Ticket, duration
from llmgw.gateway.response import Response
from llmgw.gateway.table import RoutingTable
from tests.fixtures.gateway import lora, model

_HASH = hash_secret("llmgw_k_" + "0" * 48, n=2)


def key(name="k", **limits) -> ApiKey:
    return ApiKey.model_validate({"kind": "ApiKey", "metadata": {"name": name},
                                  "spec": {"owner": "o", "secretHash": _HASH, "limits": limits}})


def admit_all(admission: Admission, k: ApiKey, n: int) -> list[Ticket | Response]:
    return [admission.admit(k, "m", lambda: None) for _ in range(n)]


def test_concurrency_share_is_the_limit_over_the_gateways_rounded_up():
    admission = Admission(lambda m: {}, lambda n: n)
    admission.set_gateways(2)
    k = key(concurrentRequests=3)
    got = admit_all(admission, k, 3)
    assert [isinstance(t, Ticket) for t in got] == [True, True, False]   # ceil(3 / 2) = 2
    refused = got[2]
    assert isinstance(refused, Response) and refused.status == 429
    assert b'"concurrency_limit_exceeded"' in refused.body
    assert isinstance(got[0], Ticket)
    got[0].release()
    assert isinstance(admission.admit(k, "m", lambda: None), Ticket)   # room again


def test_requests_bucket_shrinks_when_a_gateway_joins():
    admission = Admission(lambda m: {}, lambda n: n)
    k = key(requestsPerMinute=60)
    admission.set_gateways(3)
    got = admit_all(admission, k, 25)
    admitted = sum(isinstance(t, Ticket) for t in got)
    assert 20 <= admitted <= 21       # 60 / 3 in a burst (and what refills meanwhile)
    refused = next(t for t in got if isinstance(t, Response))
    head = refused.headers.decode()
    assert "x-ratelimit-limit-requests: 60\r\n" in head and "Retry-After: 3\r\n" in head


def test_a_revoked_key_ends_its_requests_in_flight():
    admission = Admission(lambda m: {}, lambda n: n)
    ended: list[int] = []
    k = key()
    for i in range(3):
        assert isinstance(admission.admit(k, "m", lambda i=i: ended.append(i)), Ticket)
    assert admission.in_flight("k") == 3
    admission.revoke("k")
    assert sorted(ended) == [0, 1, 2] and admission.in_flight("k") == 0


def test_scope_by_names_aliases_and_labels():
    names = {"llama": "llama", "small": "llama", "gold": "gold"}
    admission = Admission(lambda m: {"tier": "gold"} if m == "gold" else {}, names.get)
    by_alias = ApiKey.model_validate({"kind": "ApiKey", "metadata": {"name": "a"},
                                      "spec": {"owner": "o", "secretHash": _HASH, "models": ["small"]}})
    by_label = ApiKey.model_validate({"kind": "ApiKey", "metadata": {"name": "b"},
                                      "spec": {"owner": "o", "secretHash": _HASH, "modelSelector": {"tier": "gold"}}})
    assert admission.allows(by_alias, "llama") and not admission.allows(by_alias, "gold")
    assert admission.allows(by_label, "gold") and not admission.allows(by_label, "llama")
    assert admission.allows(key(), "anything")


def test_an_adapters_scope_is_its_own_name_or_labels():
    t = RoutingTable()
    t.apply("models", "ADDED", model("llama"))
    t.apply("adapters", "ADDED", lora("sql", "llama", labels={"team": "data"}))
    t.apply("adapters", "ADDED", lora("chat", "llama"))
    admission = Admission(t.labels, t.resolve)

    def scoped(**spec) -> ApiKey:
        return ApiKey.model_validate({"metadata": {"name": "k"}, "spec": {"owner": "o", "secretHash": _HASH, **spec}})
    assert admission.allows(scoped(models=["sql"]), "sql") and not admission.allows(scoped(models=["sql"]), "chat")
    assert not admission.allows(scoped(models=["llama"]), "sql"), "the base's scope is not its adapters'"
    assert admission.allows(scoped(modelSelector={"team": "data"}), "sql")
    assert not admission.allows(scoped(modelSelector={"team": "data"}), "chat")


def test_reset_durations_read_as_openai_writes_them():
    assert [duration(s) for s in (0.02, 1, 6.2, 60, 3723)] == ["20ms", "1s", "7s", "1m0s", "1h2m3s"]


def test_refusals_read_as_docs_gateway_md_shows_them():
    import json
    admission = Admission(lambda m: {}, lambda n: n)
    admission.set_gateways(2)
    k = key("team-a", requestsPerMinute=20, concurrentRequests=4)
    got = admit_all(admission, k, 3)
    refused = got[2]   # ceil(4 / 2) = 2 at this gateway
    assert isinstance(refused, Response) and json.loads(refused.body)["error"] == {
        "message": "Rate limit reached for API key team-a on concurrent requests: limit 4 (2 at this gateway, "
                   "one of 2); retry in 1.0 s",
        "type": "rate_limit_error", "param": None, "code": "concurrency_limit_exceeded"}
    assert refused.headers.decode().endswith("Retry-After: 1\r\nretry-after-ms: 1000\r\n")
    for t in got[:2]:
        assert isinstance(t, Ticket)
        t.release()
    for _ in range(12):   # one at a time: the requests bucket (10 here) refuses, not concurrency
        rpm = admission.admit(k, "m", lambda: None)
        if isinstance(rpm, Response):
            break
        rpm.release()
    assert isinstance(rpm, Response)
    error = json.loads(rpm.body)["error"]
    assert error["message"].startswith("Rate limit reached for API key team-a on requests per minute: limit 20 "
                                       "(10 at this gateway, one of 2); retry in ")
    assert (error["type"], error["param"], error["code"]) == ("rate_limit_error", None, "rate_limit_exceeded")

"""The Responses API's ids naming their replica (llmgw/gateway/responses.py), without processes:
what is rewritten in a body and in a stream cut anywhere, and what is read back."""
from __future__ import annotations

import json

from llmgw.gateway.responses import Relabel, home

BODY = json.dumps({"id": "resp_1", "previous_response_id": "resp_0", "output": [
    {"id": "msg_1", "content": [{"text": 'it said "id": "resp_x"'}]}]}).encode()


def test_a_bodys_response_ids_name_the_replica_and_nothing_else_is_touched():
    out = json.loads(Relabel("ns-r0").whole(BODY))
    assert home(out["id"]) == ("resp_1", "ns-r0") and home(out["previous_response_id"]) == ("resp_0", "ns-r0")
    assert out["output"] == json.loads(BODY)["output"]   # an item's id, and text that looks like one


def test_a_stream_cut_anywhere_comes_out_the_same():
    events = b"".join(b"event: e\ndata: " + json.dumps({"response": {"id": f"resp_{i}"}}).encode() + b"\n\n"
                      for i in range(3))
    whole = Relabel("r").whole(events)
    for cut in range(1, len(events)):
        r = Relabel("r")
        assert r.chunk(events[:cut]) + r.chunk(events[cut:]) + r.end() == whole, cut
    assert whole.count(b"~") == 3


def test_only_ids_the_gateway_made_are_read_back():
    assert home("resp_1") is None and home("resp_1~") is None and home("~cg") is None
    assert home("resp_1~%%%") is None and home("resp_1~_w") is None   # not base64url; not UTF-8

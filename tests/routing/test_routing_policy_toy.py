"""A routing policy added by writing one module and registering it (tests/fixtures/toy_routing_policy.py):
a Model names it, the API validates it, and a real gateway routes by it to real sim engines."""
from __future__ import annotations

import json

import aiohttp
import pytest

from llmgw.api import Model
from llmgw.gateway.proxy import REPLICA_HEADER
from llmgw.routing import POLICIES, register
from tests.fixtures.gateway import Sim, running_gateway
from tests.gateway.test_gateway_routing import routed_table


@pytest.fixture(autouse=True, scope="module")
def unregister_the_toy():
    """Other modules see the built-in policies alone: the toy goes when this module is done."""
    yield
    POLICIES.pop("toy-last-replica", None)


@pytest.fixture(scope="module")
def engines():
    started = [Sim.start("m") for _ in range(3)]
    yield started
    for s in started:
        s.stop()


def test_a_model_may_name_a_policy_only_once_it_is_registered():
    spec = {"metadata": {"name": "m"}, "spec": {"profiles": [{"engine": "sim"}],
                                                "routing": {"policy": "toy-last-replica"}}}
    POLICIES.pop("toy-last-replica", None)
    with pytest.raises(ValueError, match="unknown routing policy 'toy-last-replica'"):
        Model.model_validate(spec)
    import tests.fixtures.toy_routing_policy
    register(tests.fixtures.toy_routing_policy.LastReplica)   # as importing it the first time does
    assert Model.model_validate(spec).spec.routing.policy == "toy-last-replica"
    assert "toy-last-replica" in Model.model_json_schema()["$defs"]["RoutingSpec"]["properties"]["policy"]["enum"]


async def test_the_gateway_routes_by_the_toy_policy(engines):
    from tests.fixtures.toy_routing_policy import LastReplica
    register(LastReplica)

    async with running_gateway(routed_table("toy-last-replica", engines)) as gw:
        async with aiohttp.ClientSession() as session:
            async def ask(headers: dict[str, str]) -> str:
                body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}
                async with session.post(gw.url + "/v1/chat/completions", data=json.dumps(body),
                                        headers={"Content-Type": "application/json", **headers}) as r:
                    assert r.status == 200
                    return r.headers[REPLICA_HEADER]

            assert {await ask({}) for _ in range(5)} == {"m-2"}
            assert await ask({"X-Session-Id": "first"}) == "m-0"   # its key, made of the request
        policy = gw.gateway.balancer.policy("m", gw.table.routing("m"))
        assert isinstance(policy, LastReplica) and policy.picks == 6


def test_a_second_policy_of_the_same_name_is_refused():
    import tests.fixtures.toy_routing_policy
    from llmgw.routing import register

    class Impostor(tests.fixtures.toy_routing_policy.LastReplica):
        pass

    with pytest.raises(ValueError, match="registered twice"):
        register(Impostor)

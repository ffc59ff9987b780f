"""One error contract: the store and the REST client raise llmgw.api.errors' classes.

Code written against llmgw.api.ObjectClient (a controller's helper, say) catches
``llmgw.api.errors.NotFound`` and holds whichever implementation it is given: the
controllers' store over etcd, or the REST client over the API server. Both are
run here against one etcd, the REST client through a real `llmgw server`.
"""
from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

import llmgw.client.errors as client_errors
import llmgw.store.errors as store_errors
from controllers.nodes import node_deleted
from llmgw.api import Node, ObjectClient
from llmgw.api import errors as api
from llmgw.runtime.cache import Cache
from llmgw.store import Store
from tests.fixtures.cluster import ApiServer, api_server, ca_dir  # noqa: F401
from tests.fixtures.ctrlkit import node

# Each implementation's class for each error of the contract (the store has no
# Forbidden or BadRequest: it authorizes nothing and takes typed arguments).
STORE = {api.NotFound: store_errors.NotFound, api.AlreadyExists: store_errors.AlreadyExists,
         api.Conflict: store_errors.Conflict, api.Expired: store_errors.Compacted,
         api.Unavailable: store_errors.StoreUnavailable}
CLIENT = {api.NotFound: client_errors.NotFound, api.AlreadyExists: client_errors.AlreadyExists,
          api.Conflict: client_errors.Conflict, api.Expired: client_errors.Expired,
          api.Unavailable: client_errors.Unavailable, api.Forbidden: client_errors.Forbidden,
          api.BadRequest: client_errors.BadRequest, api.Invalid: client_errors.Invalid,
          api.Unauthorized: client_errors.Unauthorized}


@pytest.mark.parametrize("base", sorted(CLIENT, key=lambda c: c.__name__))
def test_each_error_of_either_implementation_is_the_contracts(base: type[api.StatusError]) -> None:
    assert issubclass(CLIENT[base], base)
    if base in STORE:
        assert issubclass(STORE[base], base)
        assert STORE[base].code == base.code   # the server answers a store error with its base's code
    # an error of one kind is never taken for another (NotFound is not a Conflict)
    for other in CLIENT:
        if not issubclass(base, other):
            assert not issubclass(CLIENT[base], other)
            assert base not in STORE or not issubclass(STORE[base], other)


def test_the_stores_refusals_of_a_lost_leader_and_a_taken_name_are_conflicts() -> None:
    assert issubclass(store_errors.FencedOut, api.Conflict)
    assert issubclass(store_errors.NameTaken, api.Conflict) and store_errors.NameTaken.reason == "NameTaken"


async def check_node_deleted(objects: ObjectClient) -> None:
    """controllers.nodes.node_deleted, which takes any ObjectClient, judged through ``objects``."""
    empty = Cache()   # nothing cached: the verdict is the ObjectClient's
    await objects.create(node("n1"))
    assert await node_deleted(empty, objects, "n1") is False
    await objects.delete(Node, "n1")
    assert await node_deleted(empty, objects, "n1") is True   # its NotFound was caught
    with pytest.raises(api.NotFound):
        await objects.get(Node, "n1")


async def test_a_controller_helper_runs_against_the_store(store: Store) -> None:
    await check_node_deleted(store)


async def test_a_controller_helper_runs_against_the_rest_client(api_server: ApiServer) -> None:
    async with api_server.client() as c:
        await check_node_deleted(c)
        with pytest.raises(api.AlreadyExists) as err:
            await c.create(node("twice"))
            await c.create(node("twice"))
        assert err.value.code == 409 and err.value.reason == "AlreadyExists"


# Where the contract has a class, code outside the two implementations imports the contract's:
# `from llmgw.client import NotFound` would hold only while the caller is given a REST client.
# An implementation's own errors with no twin in the contract (the client's TLSError and
# Unreachable, the store's Compacted, FencedOut, StoreUnavailable) may be imported from it.
DEFINERS = ("llmgw/api/", "llmgw/store/", "llmgw/client/")   # the contract and its two implementations


def _imports_of_a_twin(path: Path) -> list[str]:
    found = []
    for stmt in ast.walk(ast.parse(path.read_text(), str(path))):
        if not (isinstance(stmt, ast.ImportFrom) and stmt.module and stmt.module.startswith("llmgw.")):
            continue
        if stmt.module == "llmgw.api" or stmt.module.startswith("llmgw.api."):
            continue
        module = importlib.import_module(stmt.module)
        for alias in stmt.names:
            obj = getattr(module, alias.name, None)
            if (isinstance(obj, type) and issubclass(obj, api.StatusError)
                    and getattr(api, obj.__name__, None) not in (None, obj)):
                found.append(f"{path}:{stmt.lineno}: {alias.name} from {stmt.module}, not llmgw.api.errors")
    return found


def test_code_that_catches_a_contract_error_imports_the_contracts() -> None:
    root = Path(__file__).resolve().parents[2]
    files = [*root.glob("llmgw/**/*.py"), *root.glob("controllers/*.py"), *root.glob("tests/fixtures/*.py")]
    checked = [f for f in files if not f.relative_to(root).as_posix().startswith(DEFINERS)]
    assert len(checked) > 100
    assert [line for f in sorted(checked) for line in _imports_of_a_twin(f)] == []


def test_a_wait_under_a_millisecond_is_said_as_one_not_as_zero() -> None:
    """A renewal refused just before the bucket's next token is told to wait 0.4 ms: said "0.000",
    the client read a 429 with no wait at all (tests/server/test_server_renewals.py, under load)."""
    said = api.TooManyRequests("too many renewals at once", 0.0004).details
    assert said == {"retryAfterSeconds": "0.001"}
    err = client_errors.error_for(429, "TooManyRequests", "", "https://server", said)
    assert isinstance(err, client_errors.TooManyRequests) and err.retry_after == 0.001
    assert api.TooManyRequests("", 0.25).details == {"retryAfterSeconds": "0.250"}

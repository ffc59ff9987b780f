"""The index a user's decision reads (llmgw/server/rbac.py's Bindings), fed Roles and
RoleBindings as its watch feeds them: what "*" grants, and changes reaching the subjects they
touch."""
from __future__ import annotations

from llmgw.api import parse_object
from llmgw.server.authz import Action, Authorizer
from llmgw.server.rbac import Bindings
from llmgw.store import Store

V1 = "llmgw.io/v1"


def role(name: str, *rules: dict):
    return parse_object({"apiVersion": V1, "kind": "Role", "metadata": {"name": name}, "spec": {"rules": list(rules)}})


def binding(name: str, role_name: str, kind: str, subject: str):
    return parse_object({"apiVersion": V1, "kind": "RoleBinding", "metadata": {"name": name},
                         "spec": {"roleRef": {"name": role_name}, "subjects": [{"kind": kind, "name": subject}]}})


def test_every_verb_and_kind_and_changes_reach_the_subjects():
    index = Bindings(Store("http://127.0.0.1:1"))     # never connected: fed by hand
    authz = Authorizer(None, index)  # type: ignore[arg-type]  # no node asks: no shards to look up

    def granted(user: str, groups: tuple[str, ...], verb: str, kind: str) -> bool:
        return authz.granting(user, groups, Action(verb, kind, "x")) is not None

    index.roles.change("ADDED", role("reader", {"verbs": ["get"], "kinds": ["*"]}))
    index.bindings.change("ADDED", binding("b-admin", "admin", "User", "ann"))
    index.bindings.change("ADDED", binding("b-readers", "reader", "Group", "readers"))
    # admin (every verb, every kind) grants even what no rule can name: a heartbeat
    assert granted("ann", (), "heartbeat", "heartbeat") and granted("ann", (), "delete", "nodes")
    assert granted("bob", ("readers",), "get", "nodes") and granted("bob", ("readers",), "get", "events")
    assert not granted("bob", ("readers",), "list", "nodes") and not granted("bob", ("readers",), "heartbeat",
                                                                             "heartbeat")
    assert not granted("bob", (), "get", "nodes")     # not in the group
    index.roles.change("MODIFIED", role("reader", {"verbs": ["list"], "kinds": ["models"]}))
    assert granted("bob", ("readers",), "list", "models") and not granted("bob", ("readers",), "get", "nodes")
    index.bindings.change("DELETED", binding("b-readers", "reader", "Group", "readers"))
    assert not granted("bob", ("readers",), "list", "models")
    index.bindings.change("MODIFIED", binding("b-admin", "reader", "User", "ann"))   # rebound to another role
    assert granted("ann", (), "list", "models") and not granted("ann", (), "delete", "nodes")

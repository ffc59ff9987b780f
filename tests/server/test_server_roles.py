"""Roles and RoleBindings with a real server (issue 51): every kind x every verb for a `view` user,
an `operate` group and a team bound to a Role with a label selector; each cell's answer from the
server, and `auth can-i`'s (the access review) for the same cell, which must agree."""
from __future__ import annotations

import asyncio

import pytest
from click.testing import CliRunner

from llmgw.api import KINDS, ApiKey, GitSecretRef, GitSource, InvalidObject, Model, Node, parse_object
from llmgw.api.secrets import REDACTED, hash_secret, verify_secret
from llmgw.api.wellknown import RECONCILE_REQUESTED_AT
from llmgw.cli.auth import auth
from llmgw.cli.describe import describe
from llmgw.cli.get import get
from llmgw.client import Forbidden, Invalid, Unauthorized
from llmgw.pki import identity_from_pem_file
from tests.fixtures.cluster import llmgw_ca, shared_api_server  # noqa: F401
from tests.fixtures.poll import until

V1 = "llmgw.io/v1"
_HASH = hash_secret("llmgw_k_" + "0" * 48, n=2)   # the cheapest scrypt: only its shape matters here


def doc(kind: str, name: str, labels: dict[str, str] | None = None):
    """An object of `kind` (plural) named `name`, the least each kind takes."""
    specs = {
        "nodes": {},
        "models": {"profiles": [{"engine": "sim"}]},
        "replicas": {"model": "m-other", "templateHash": "abc", "profile": {"engine": "sim"}},
        "shards": {"replica": "r1", "model": "m-other", "node": "n1", "rank": 0, "worldSize": 1,
                   "ports": {"serve": 30000, "distInit": 30001}, "headAddress": "127.0.0.1", "engine": "sim",
                   "servedModelNames": ["m-other"]},
        "apikeys": {"owner": "team-a", "secretHash": _HASH},
        "gitsources": {"url": "https://git.example/repo.git", "ref": {"branch": "main"}},
        "roles": {"rules": [{"verbs": ["get"], "kinds": ["models"]}]},
        "rolebindings": {"roleRef": {"name": "view"}, "subjects": [{"kind": "User", "name": "nobody"}]},
        "adapters": {"baseModel": "m-other", "source": "/srv/adapters/a1"},
    }
    return parse_object({"apiVersion": V1, "kind": KINDS[kind].model_fields["kind"].default,
                         "metadata": {"name": name, "labels": labels or {}}, "spec": specs[kind]})


# the object of each kind a cell reads, changes or deletes (models: the team's and another)
TARGET = {"nodes": "n1", "models": "m-other", "replicas": "r1", "shards": "s1", "apikeys": "k1",
          "gitsources": "g1", "roles": "team-models", "rolebindings": "b-view",
          "adapters": "a1"}
TEAM = {"team": "search"}
ROLES = [("team-models", [{"verbs": ["get", "create", "update", "delete", "scale"], "kinds": ["models"],
                           "labelSelector": "team=search"},
                          {"verbs": ["create"], "kinds": ["rolebindings"]}])]
BINDINGS = [("b-view", "view", [{"kind": "User", "name": "vic"}]),
            ("b-operate", "operate", [{"kind": "Group", "name": "oncall"}]),
            ("b-team", "team-models", [{"kind": "Group", "name": "search"}]),
            ("b-team-view", "view", [{"kind": "Group", "name": "search"}]),
            ("b-rita", "admin", [{"kind": "User", "name": "rita"}])]


@pytest.fixture(scope="module")
def cluster(shared_api_server):
    srv = shared_api_server

    async def setup():
        async with srv.client() as c:
            for kind in ("nodes", "models", "replicas", "shards", "apikeys", "gitsources", "adapters"):
                if kind != "models":
                    await c.create(doc(kind, TARGET[kind]))
            await c.create(doc("models", "m-other"))
            await c.create(doc("models", "m-search", TEAM))
            for name, rules in ROLES:
                await c.create(parse_object({"apiVersion": V1, "kind": "Role", "metadata": {"name": name},
                                             "spec": {"rules": rules}}))
            for name, role, subjects in BINDINGS:
                await c.create(parse_object({"apiVersion": V1, "kind": "RoleBinding", "metadata": {"name": name},
                                             "spec": {"roleRef": {"name": role}, "subjects": subjects}}))

            async def indexed():   # the last binding made has reached the server's index, so all have
                return (await c.can_i("delete", "nodes", user="rita"))["allowed"]
            await until(indexed, "the bindings to reach the server's index")
    asyncio.run(setup())
    srv.ids = {"vic": srv.issue("user", "vic"), "olga": srv.issue("user", "olga", "--group", "oncall"),
               "sam": srv.issue("user", "sam", "--group", "search"), "rita": srv.issue("user", "rita")}
    return srv


async def _watch_one(c, kind):
    async for ev in c.watch(kind):
        return ev


async def _update(admin, c, kind, name, change):
    obj = await admin.get(KINDS[kind], name)
    change(obj)
    return await c.update(obj)


def _label(obj):
    obj.metadata.labels["touched"] = "yes"


async def _delete(admin, c, kind, name):
    """Delete a copy made for the cell (the same labels as `name`), so the next cells find theirs."""
    copy = await admin.get(KINDS[kind], name)
    fresh = doc(kind, f"del-{kind[:4]}", dict(copy.metadata.labels))
    await admin.create(fresh)
    try:
        await c.delete(KINDS[kind], fresh.name)
    finally:
        try:
            await admin.delete(KINDS[kind], fresh.name)
        except Exception:   # noqa: BLE001 - the cell deleted it
            pass


def _operation(admin, c, verb, kind, name):
    """The server's answer to `verb` on `kind`'s object `name`, as the CLI's commands ask it."""
    model = KINDS[kind]
    if verb == "get":
        return c.get(model, name)
    if verb == "list":
        return c.list(model)
    if verb == "watch":
        return _watch_one(c, model)
    if verb == "create":
        return _create(admin, c, kind)
    if verb == "update":
        return _update(admin, c, kind, name, _label)
    if verb == "delete":
        return _delete(admin, c, kind, name)
    if verb == "cordon":
        return _update(admin, c, kind, name, lambda n: setattr(n.spec, "unschedulable", True))
    if verb == "drain":
        return _update(admin, c, kind, name, lambda n: setattr(n.spec, "drain", True))
    if verb == "scale":
        return _update(admin, c, kind, name, lambda m: setattr(m.spec, "replicas", 2))
    if verb == "reconcile":
        return _update(admin, c, kind, name, lambda g: g.metadata.annotations.update({RECONCILE_REQUESTED_AT: "now"}))
    raise AssertionError(verb)


async def _create(admin, c, kind):
    obj = doc(kind, f"new-{kind[:4]}", TEAM)
    try:
        await c.create(obj)
    finally:
        try:
            await admin.delete(KINDS[kind], obj.name)
        except Exception:   # noqa: BLE001 - refused: nothing was made
            pass


CELLS = [(verb, kind, TARGET[kind]) for kind in KINDS for verb in ("get", "list", "watch", "create", "update",
                                                                    "delete")]
CELLS += [("cordon", "nodes", "n1"), ("drain", "nodes", "n1"), ("scale", "models", "m-other"),
          ("reconcile", "gitsources", "g1"), ("get", "models", "m-search"), ("update", "models", "m-search"),
          ("delete", "models", "m-search"), ("scale", "models", "m-search")]
WRITES = {"create", "update", "delete", "cordon", "drain", "scale", "reconcile"}


def expected(who: str, verb: str, kind: str, name: str) -> bool:
    reads = verb in ("get", "list", "watch")
    if who == "vic":        # view
        return reads
    if who == "olga":       # operate
        return reads or (verb, kind) in {("cordon", "nodes"), ("drain", "nodes"), ("scale", "models"),
                                         ("reconcile", "gitsources")}
    # sam: view, and the team's models (labelled team=search), and create rolebindings of what he holds
    team = kind == "models" and (name == "m-search" or verb == "create") and verb in ROLES[0][1][0]["verbs"]
    return reads or team or (verb, kind) == ("create", "rolebindings")


@pytest.mark.parametrize("who", ["vic", "olga", "sam"])
async def test_every_kind_and_verb(cluster, who):
    answers = {}
    async with cluster.client() as admin, cluster.client(cluster.ids[who]) as c:
        for verb, kind, name in CELLS:
            review = await c.can_i(verb, kind, name if verb not in ("list", "watch", "create") else None,
                                   labels=TEAM if verb == "create" else None)
            try:
                await _operation(admin, c, verb, kind, name)
                allowed = True
            except Forbidden as err:
                assert err.code == 403 and f"user {who}" in str(err) and "no binding grants it" in str(err), err
                allowed = False
            answers[(verb, kind, name)] = allowed
            assert review["allowed"] == allowed, (verb, kind, name, review)
    wrong = {cell: got for cell, got in answers.items() if got != expected(who, *cell)}
    assert not wrong


async def test_view_reads_api_keys_without_their_hashes(cluster):
    """`view` reads ApiKeys with spec.secretHash redacted, in a get, a list and a watch (its first
    items and a change streamed after); an admin, a certificate's or a user bound to `admin`, reads it."""
    async with cluster.client() as admin, cluster.client(cluster.ids["vic"]) as vic, \
            cluster.client(cluster.ids["rita"]) as rita:
        _, rev = await vic.list(ApiKey)
        watch = vic.watch(ApiKey, from_revision=rev + 1)
        first = asyncio.ensure_future(anext(watch))
        await asyncio.sleep(0.3)   # the watch is open before the change
        key = await admin.get(ApiKey, "k1")
        key.metadata.labels["seen"] = "yes"
        await admin.update(key)
        changed = await asyncio.wait_for(first, 10)
        await watch.aclose()
        read = [await vic.get(ApiKey, "k1"), next(k for k in (await vic.list(ApiKey))[0] if k.name == "k1"),
                (await _watch_one(vic, ApiKey)).object, changed.object]
        assert changed.type == "MODIFIED" and changed.object.metadata.labels["seen"] == "yes"
        assert [k.spec.secretHash for k in read] == [REDACTED] * 4
        assert [k.spec.owner for k in read] == ["team-a"] * 4
        assert not verify_secret("llmgw_k_" + "0" * 48, REDACTED)   # a redacted hash matches no secret
        assert (await admin.get(ApiKey, "k1")).spec.secretHash == _HASH
        assert (await rita.get(ApiKey, "k1")).spec.secretHash == _HASH
        assert (await _watch_one(rita, ApiKey)).object.spec.secretHash == _HASH


async def test_no_one_binds_themselves_to_more(cluster):
    async with cluster.client(cluster.ids["sam"]) as c:
        with pytest.raises(Forbidden) as err:
            await c.create(parse_object({"apiVersion": V1, "kind": "RoleBinding", "metadata": {"name": "sam-admin"},
                                         "spec": {"roleRef": {"name": "admin"},
                                                  "subjects": [{"kind": "User", "name": "sam"}]}}))
        assert "rule escalation:" in str(err.value) and "*" in str(err.value)
        await c.create(parse_object({"apiVersion": V1, "kind": "RoleBinding", "metadata": {"name": "sam-view"},
                                     "spec": {"roleRef": {"name": "view"},
                                              "subjects": [{"kind": "User", "name": "sam"}]}}))


async def test_builtin_roles_are_listed_and_not_editable(cluster):
    async with cluster.client() as admin:
        roles, _ = await admin.list(KINDS["roles"])
        assert {"view", "operate", "edit", "admin", "team-models"} <= {r.name for r in roles}
        with pytest.raises(Forbidden) as err:
            await admin.delete(KINDS["roles"], "view")
        assert "rule builtin-role:" in str(err.value)


async def test_revoked_user_is_refused_whatever_its_bindings(cluster):
    async with cluster.client(cluster.ids["rita"]) as c:
        await c.update(await c.get(Node, "n1"))     # bound to admin
        serial = identity_from_pem_file(cluster.ids["rita"][0]).serial
        await asyncio.to_thread(llmgw_ca, "revoke", serial, "--dir", str(cluster.pki.dir), "--server", cluster.url,
                                "--ca", cluster.ca, "--cert", cluster.admin[0], "--key", cluster.admin[1])

        async def refused():
            try:
                await c.get(Model, "m-other")
            except Unauthorized as err:
                return err
            return None
        err = await until(refused, "the revoked user certificate to be refused")
        assert err.reason == "CertificateRevoked"


def test_can_i_exit_status_and_as(cluster):
    def can_i(ident, *args):
        return CliRunner().invoke(auth, ["can-i", *args, "--server", cluster.url, "--ca", cluster.ca,
                                         "--cert", ident[0], "--key", ident[1]])
    assert can_i(cluster.ids["vic"], "get", "models/m-other").exit_code == 0
    no = can_i(cluster.ids["vic"], "delete", "models/m-other")
    assert no.exit_code == 1 and "no binding grants it" in no.output
    assert can_i(cluster.admin, "scale", "models/m-search", "--as", "x", "--as-group", "search").exit_code == 0
    assert can_i(cluster.admin, "scale", "models/m-other", "--as", "x", "--as-group", "search").exit_code == 1
    assert can_i(cluster.ids["vic"], "get", "models", "--as", "olga").exit_code == 4    # --as is the admins'


@pytest.mark.parametrize("doc_, problem", [
    ({"kind": "Role", "spec": {"rules": [{"verbs": ["get", "fly"], "kinds": ["models"]}]}},
     "spec.rules[0].verbs[1]: unknown verb 'fly'"),
    ({"kind": "Role", "spec": {"rules": [{"verbs": ["get"], "kinds": ["pods"]}]}},
     "spec.rules[0].kinds[0]: unknown kind 'pods'"),
    ({"kind": "Role", "spec": {"rules": [{"verbs": ["get"], "kinds": ["models"], "labelSelector": "a in (b)"}]}},
     "spec.rules[0].labelSelector: selector 'a in (b)': set-based requirements"),
    ({"kind": "Role", "spec": {"rules": []}}, "spec.rules: List should have at least 1 item"),
    ({"kind": "RoleBinding", "spec": {"roleRef": {"name": "view"}, "subjects": [{"kind": "Robot", "name": "r"}]}},
     "spec.subjects[0].kind: Input should be 'User' or 'Group'"),
])
def test_roles_are_validated_with_field_paths(doc_, problem):
    with pytest.raises(InvalidObject) as err:
        parse_object({"apiVersion": V1, "metadata": {"name": "x"}, **doc_})
    assert any(p.startswith(problem) for p in err.value.problems), err.value.problems


def test_get_roles_and_rolebindings(cluster):
    flags = ["--server", cluster.url, "--ca", cluster.ca, "--cert", cluster.admin[0], "--key", cluster.admin[1]]
    out = CliRunner().invoke(get, ["roles,rolebindings", *flags])
    assert out.exit_code == 0, out.output
    roles, bindings = out.output.split("\n\n")
    assert roles.split()[:4] == ["NAME", "BUILTIN", "RULES", "AGE"] and "team-models" in roles
    assert "view" in roles.split() and "b-operate" in bindings and "oncall" in bindings
    described = CliRunner().invoke(describe, ["role", "team-models", *flags])
    assert "rule: get,create,update,delete,scale models labelled team=search" in described.output


async def test_a_team_cannot_label_another_model_into_its_scope(cluster):
    async with cluster.client() as admin, cluster.client(cluster.ids["sam"]) as c:
        with pytest.raises(Forbidden):
            await _update(admin, c, "models", "m-other", lambda m: m.metadata.labels.update(TEAM))
        with pytest.raises(Forbidden):   # nor its own out of it
            await _update(admin, c, "models", "m-search", lambda m: m.metadata.labels.update(team="ads"))
        assert (await admin.get(Model, "m-search")).metadata.labels["team"] == "search"


def test_whoami(cluster):
    out = CliRunner().invoke(auth, ["whoami", "--server", cluster.url, "--ca", cluster.ca,
                                    "--cert", cluster.ids["sam"][0], "--key", cluster.ids["sam"][1]])
    assert out.exit_code == 0, out.output
    lines = out.output.splitlines()
    assert lines[:3] == ["name: sam", "role: user", "groups: search"]
    assert lines[3].startswith("bindings: b-team, b-team-view")   # (and sam-view, when made above)


def gitsource(name, url="https://git.example/repo.git", secret=None):
    spec = {"url": url, "ref": {"branch": "main"}, **({"secretRef": {"file": secret}} if secret else {})}
    return parse_object({"apiVersion": V1, "kind": "GitSource", "metadata": {"name": name}, "spec": spec})


async def test_an_editor_names_only_credentials_files_and_no_local_repository(cluster):
    """`edit` writes GitSources: a secretRef is a file name in the controller-manager's credentials
    directory (a path is 422 at spec.secretRef.file, nothing stored), and a file:// url, which reads
    the controller-manager's host, is an admin's (403 at spec.url, rule gitsource-file-url)."""
    async with cluster.client() as admin:
        await admin.create(parse_object({"apiVersion": V1, "kind": "RoleBinding", "metadata": {"name": "b-edit"},
                                         "spec": {"roleRef": {"name": "edit"},
                                                  "subjects": [{"kind": "User", "name": "eddie"}]}}))
        await admin.create(gitsource("g-private", secret="fleet.token"))
        await admin.create(gitsource("g-local-admin", url="file:///srv/repos/infra"))
    eddie = cluster.issue("user", "eddie")
    paths = ["/etc/llmgw/etcd/controller-manager.key", "../etcd/controller-manager.key", "sub/token", ".."]
    async with cluster.client() as admin, cluster.client(eddie) as c:
        async def bound():
            return (await c.can_i("create", "gitsources"))["allowed"]
        await until(bound, "eddie's binding to reach the server's index")
        for path in paths:
            body = gitsource("g-key").model_dump(mode="json")
            body["spec"]["secretRef"] = {"file": path}
            with pytest.raises(Invalid) as err:
                await c.request("POST", "/apis/llmgw.io/v1/gitsources", body=body)
            assert "spec.secretRef.file: " in str(err.value) and "without a path" in str(err.value), path
        refused = [lambda c: c.create(gitsource("g-local", url="file:///srv/repos/infra")),
                   lambda c: c.apply(gitsource("g-local", url="file:///srv/repos/infra")),
                   lambda c: _update(admin, c, "gitsources", "g-private",
                                     lambda g: setattr(g.spec, "url", "file:///srv/repos/infra")),
                   lambda c: _update(admin, c, "gitsources", "g-local-admin",
                                     lambda g: setattr(g.spec, "url", "file:///etc"))]
        for i, write in enumerate(refused):
            with pytest.raises(Forbidden) as err:
                await write(c)
            assert "rule gitsource-file-url:" in str(err.value) and "spec.url" in str(err.value), i
        assert not {g.name for g in (await admin.list(GitSource))[0]} & {"g-key", "g-local"}   # nothing stored
        await c.create(gitsource("g-public", secret="fleet.token"))
        await _update(admin, c, "gitsources", "g-private",
                      lambda g: setattr(g.spec, "url", "https://other.example/r.git"))
        await _update(admin, c, "gitsources", "g-private",
                      lambda g: setattr(g.spec, "secretRef", GitSecretRef(file="other.token")))
        await _update(admin, c, "gitsources", "g-local-admin",
                      lambda g: g.metadata.annotations.update({RECONCILE_REQUESTED_AT: "now"}))
        await _update(admin, c, "gitsources", "g-local-admin", lambda g: setattr(g.spec, "suspend", True))

"""Who am I, and may I: `GET /whoami` (`llmgw auth whoami`) and `POST /accessreviews` (`llmgw auth
can-i`, Kubernetes' SelfSubjectAccessReview), answered by the server's one authorizer, so the answer
is the server's own decision for that request."""
from __future__ import annotations

from dataclasses import replace

from aiohttp import web

from llmgw.api import ANY, EVENTS, KINDS, RULE_VERBS
from llmgw.api.errors import BadRequest, NotFound
from llmgw.pki import Identity
from llmgw.server.authz import Authorizer, Denied, review_action
from llmgw.server.rbac import Bindings
from llmgw.server.request import json_response, read_body, unknown_kind, url_name
from llmgw.store import Store


def whoami_body(who: Identity, bindings: Bindings) -> dict[str, object]:
    return {"name": who.name, "role": who.role, "groups": list(who.all_groups),
            "serial": who.serial, "notAfter": who.not_after.isoformat(),
            "bindings": bindings.bound(who.name, who.groups) if who.role == "user" else []}


class Access:
    def __init__(self, store: Store, authz: Authorizer) -> None:
        self.store, self.authz = store, authz

    async def whoami(self, request: web.Request) -> web.Response:
        return json_response(whoami_body(request["identity"], self.authz.bindings))

    async def review(self, request: web.Request) -> web.Response:
        """{verb, kind, name?, labels?, user?, groups?} -> {allowed, reason}: what the server would answer
        that identity (`user`/`groups`: another user's, an admin's question alone, rule "as-admin");
        the object's labels are the stored object's, or for one not stored (a create) `labels`."""
        body = await read_body(request)
        verb, kind, name = body.get("verb"), body.get("kind"), body.get("name")
        if verb not in RULE_VERBS:
            raise BadRequest(f"verb: use one of {', '.join(RULE_VERBS)}")
        if kind == ANY or (kind not in KINDS and kind != EVENTS):
            raise BadRequest(f"kind: {unknown_kind(kind)}")
        if name is not None and not isinstance(name, str):
            raise BadRequest("name: a string")
        who: Identity = request["identity"]
        user, groups = body.get("user"), body.get("groups") or []
        if user is not None or groups:
            if who.role != "admin":
                raise Denied("as-admin", f"only an admin (O=llmgw:admins) may ask for another user; {who} may not")
            if not isinstance(user, str) or not user or not all(isinstance(g, str) and g for g in groups):
                raise BadRequest("user: a name, and groups: a list of names")
            who = replace(who, role="user", name=user, org="", groups=tuple(groups))
        labels = body.get("labels")
        if labels is not None and not (isinstance(labels, dict) and all(
                isinstance(k, str) and isinstance(v, str) for k, v in labels.items())):
            raise BadRequest("labels: an object of label names to values")
        if name is not None and kind in KINDS:
            url_name("name", name)
            try:
                labels = (await self.store.get(KINDS[kind], name)).metadata.labels
            except NotFound:
                pass
        act = review_action(verb, kind, name, labels)
        try:
            await self.authz.check(who, act)
        except Denied as d:
            return json_response({"allowed": False, "reason": str(d), "rule": d.rule})
        what = f"{kind}/{name}" if name else kind
        return json_response({"allowed": True, "reason": f"{who.name} may {verb} {what}"})

"""Authorization by client certificate (issue 3, part 3; node rights: docs/contracts.md, "Node rights").

Rules, by the certificate's organisation:
  admins           (O=llmgw:admins)      everything, and they alone revoke certificates and manage
                                         API keys (apikeys)
  controller-manager (O=llmgw:components) everything but revoking, engine logs and API keys
  gateway          (O=llmgw:components)  get/list/watch models, replicas, nodes, apikeys, adapters (and read
                                         their usage, GET /usage/apikeys, as admins do); report its
                                         demand (POST /demand/<gateway>) and withdraw it (DELETE),
                                         which no one else but an admin may
  node N           (O=llmgw:nodes, CN=N) get its own Node, ask the weights index for the Nodes
                                         holding what it pulls (GET nodes?weights=, its peers),
                                         never list the fleet (rule "node-list"); create it with
                                         labels and the agent's
                                         status fields only; write the agent's status fields of
                                         it (never its spec, labels, annotations or finalizers);
                                         heartbeat as N, get/list/watch Shards bound to N
                                         (list and watch must say node=N), their status,
                                         events about N and its shards, and get the Models
                                         and Replicas its shards reference; get/list/watch
                                         Adapters (what its engines load); read the
                                         engine logs of its own shards (never another node's)
  user             (OU=llmgw:users)      what the Roles bound to its CN or its groups grant
                                         (llmgw/server/rbac.py), never more: a Role or a RoleBinding it
                                         writes grants no rule it does not hold (rule "escalation")
Engine logs (GET shards/<name>/log, replicas/<name>/log) are the admins', each node's own, and
those of a user granted `logs`. The built-in roles (view, operate, edit, admin) are written by no
one (rule "builtin-role"); a user sets no GitSource's url to a file:// URL, nor the url of one
that has one (rule "gitsource-file-url": it reads the controller-manager's host); a secretRef is
a file name in the controller-manager's credentials directory, checked by the API and the
controller (controllers/gitfetch.py), so any writer of GitSources may name one. Anything else is
Forbidden, with the rule's name in the message.

A request is authorized twice (docs/contracts.md, "REST"): first by its URL alone, before
its body is read (``Action.final`` false: what the URL does not say, the body's name, the
stored shard's node, the fields written, is not known yet, and a rule that needs it lets
the request on), then once the object is decoded, with everything known. So an identity
that may not use a URL is refused before anything it sent is parsed, as Kubernetes does.
"""
from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass

from llmgw.api import NODE_AGENT_STATUS_FIELDS, AnyObject, GitSource, PolicyRule, Role, RoleBinding
from llmgw.api.errors import Forbidden
from llmgw.pki import Identity
from llmgw.server.rbac import BUILTIN_ROLES, Bindings, Target, narrowed, rule_verbs, uncovered

READ = {"get", "list", "watch"}

# What a node may write of its own Node: when registering (creating it), the labels its agent
# was given (--label) and the agent's status fields; afterwards, the agent's status fields.
NODE_STATUS_FIELDS = frozenset(f"status.{f}" for f in NODE_AGENT_STATUS_FIELDS)
NODE_CREATE_FIELDS = NODE_STATUS_FIELDS | {"metadata.labels"}
# Metadata a client writes; the rest (uid, generation, resourceVersion, ...) the store sets.
CLIENT_METADATA = ("labels", "annotations", "finalizers", "ownerReferences", "deletionTimestamp")


def written_fields(new: AnyObject, old: AnyObject | None = None) -> frozenset[str]:
    """The fields (`metadata.labels`, `spec.drain`, `status.gpus`, ...) that `new` sets: those that
    differ from `old`, or, for a new object, from their defaults (a required field always counts)."""
    out = set()
    for part in ("metadata", "spec", "status"):
        value, before = getattr(new, part), getattr(old, part) if old is not None else None
        for name, info in type(value).model_fields.items():
            if part == "metadata" and name not in CLIENT_METADATA:
                continue
            if before is not None:
                base = getattr(before, name)
            elif info.is_required():
                out.add(f"{part}.{name}")
                continue
            else:
                base = info.get_default(call_default_factory=True)
            if getattr(value, name) != base:
                out.add(f"{part}.{name}")
    return frozenset(out)


def changed_fields(new: AnyObject, old: AnyObject) -> frozenset[str]:
    """written_fields of a change, each annotation it sets or removes by its key
    (`metadata.annotations.llmgw.io/reconcile-requested-at`): a user's narrower verbs read them."""
    fields = written_fields(new, old)
    if "metadata.annotations" not in fields:
        return fields
    after, before = new.metadata.annotations, old.metadata.annotations
    keys = {k for k in after.keys() | before.keys() if after.get(k) != before.get(k)}
    return (fields - {"metadata.annotations"}) | {f"metadata.annotations.{k}" for k in keys}


@dataclass
class Action:
    verb: str                 # get list watch create update status delete apply heartbeat demand events-read
                              # events-write log
    kind: str                 # plural kind, or "heartbeat"/"demand"/"events"
    name: str | None = None   # object name (for create/apply: the body's name)
    node: str | None = None   # ?node= of a list/watch
    obj_node: str | None = None  # for an existing Shard: its spec.node
    # the fields a create or status write sets (written_fields); None where not known yet
    fields: frozenset[str] | None = None
    # False: authorized by the URL, before the body is read; name, obj_node and fields may be unknown
    final: bool = True
    # for a user's rules: the stored object's labels, and those a write gives it (None: no such object)
    labels: Mapping[str, str] | None = None
    new_labels: Mapping[str, str] | None = None
    obj: AnyObject | None = None   # the object written (a Role or a RoleBinding: what it grants)
    weights: bool = False          # a list of Nodes asking the weights index (?weights=), not the fleet

    def unknown(self, value: object) -> bool:
        """`value` (one of this action's attributes) is not known yet: the request is judged by its URL."""
        return not self.final and value is None

    def __str__(self) -> str:
        what = f"{self.kind}/{self.name}" if self.name else self.kind
        return f"{self.verb} {what}" + (f" (node={self.node})" if self.node else "")


def review_action(verb: str, kind: str, name: str | None, labels: Mapping[str, str] | None) -> Action:
    """The request a rule verb on `kind` (`llmgw auth can-i`) is, as the server authorizes it: a
    `cordon` a Node update that sets spec.unschedulable, a `patch` an apply, `logs` a log read."""
    fields = narrowed(kind, verb)
    if fields is not None:
        return Action("update", kind, name, fields=fields, labels=labels, new_labels=labels)
    if verb == "update":   # any field: no narrower verb stands in for it
        return Action(verb, kind, name, fields=frozenset({"*"}), labels=labels, new_labels=labels)
    if kind == "events":
        return Action("events-write" if verb == "create" else "events-read", kind, name)
    server_verb = {"patch": "apply", "logs": "log"}.get(verb, verb)
    return Action(server_verb, kind, name, labels=labels, new_labels=labels if server_verb != "get" else None)


class Denied(Forbidden):
    """403: `rule` names the rule that refused (the answer's details); `log_line`, when set, goes to
    the server log."""

    def __init__(self, rule: str, message: str, log_line: str | None = None):
        self.rule, self.log_line = rule, log_line
        self.action: Action | None = None  # set by Authorizer.check, for the log
        super().__init__(f"forbidden by rule {rule}: {message}")

    @property
    def details(self) -> dict[str, str]:
        return {"rule": self.rule}


class Authorizer:
    def __init__(self, referenced: Callable[[str], Awaitable[tuple[set[str], set[str]]]], bindings: Bindings) -> None:
        # referenced(node) -> awaitable (models, replicas): names the node's shards reference
        self._referenced = referenced
        self.bindings = bindings

    async def check(self, who: Identity, act: Action) -> None:
        try:
            await self._check(who, act)
        except Denied as denied:
            denied.action = act
            raise

    async def _check(self, who: Identity, act: Action) -> None:
        if act.kind == "roles" and act.name in BUILTIN_ROLES and act.verb not in READ:
            raise Denied("builtin-role", f"role {act.name} is built in: no one may {act.verb} it (bind it, "
                         "or write a Role of another name)")
        if who.role == "admin":
            return
        if act.kind == "revocations":
            what = f"serial {act.name}" if act.name else "a certificate"
            raise Denied("revoke-admin", f"only an admin (O=llmgw:admins) may revoke a certificate; {who} "
                         "may not", log_line=f"refused: certificate {who} tried to revoke {what}")
        if who.role == "user":
            return self._user(who, act)
        if act.verb == "log" and who.role != "node":
            raise Denied("logs", f"only admins read engine logs (and a node those of its own shards); {who} may not")
        if act.kind == "demand" and not (who.role == "component" and who.name == "gateway"):
            raise Denied("gateway-demand", f"only a gateway (O=llmgw:components, CN=gateway) reports demand; "
                         f"{who} may not")
        if act.kind == "apikeys" and not (who.role == "component" and who.name == "gateway" and act.verb in READ):
            raise Denied("apikeys-admin", f"only an admin (O=llmgw:admins) manages API keys, and a gateway reads "
                         f"them; {who} may not {act}")
        if who.role == "component":
            return self._component(who, act)
        if who.role == "node":
            return await self._node(who, act)
        raise Denied("identity", f"certificate {who.name!r} has organisation {who.org!r}, which llmgw grants "
                     "nothing (expected llmgw:admins, llmgw:components or llmgw:nodes)")

    def granting(self, user: str, groups: tuple[str, ...], act: Action) -> PolicyRule | None:
        """The first rule bound to `user` or its `groups` that allows `act`; None: no binding grants it.
        `llmgw auth can-i` is answered by this too."""
        verbs = rule_verbs(act.verb, act.kind, act.fields)
        target = Target(act.name, act.labels, act.new_labels)
        # a list or a watch is known by its URL alone: every object, which no rule with names or a
        # selector grants
        final = act.final or act.verb in ("list", "watch", "events-read")
        return self.bindings.granting(user, groups, act.kind, verbs, target, final)

    def hides_key_hashes(self, who: Identity) -> bool:
        """Whether `who` reads ApiKeys with their spec.secretHash redacted: a user whose bindings do not
        let it update every ApiKey (the built-in view, operate and edit roles); an admin and the
        gateway read them whole."""
        return who.role == "user" and self.granting(
            who.name, who.groups, Action("update", "apikeys", fields=frozenset({"spec.secretHash"}))) is None

    def _user(self, who: Identity, act: Action) -> None:
        granted = self.granting(who.name, who.groups, act)
        if granted is not None and (not act.final or act.obj is None):
            return   # the common case, without the subject's words a refusal needs
        subject = f"user {who.name}" + (f" (groups {', '.join(who.groups)})" if who.groups else "")
        if granted is None:
            raise Denied("rbac", f"{subject} may not {act}: no binding grants it")
        if isinstance(act.obj, GitSource):
            return self._gitsource_reach(subject, act, act.obj)
        if isinstance(act.obj, Role):
            wanted = act.obj.spec.rules
        elif isinstance(act.obj, RoleBinding):
            wanted = self.bindings.rules_of_role(act.obj.spec.roleRef.name)
        else:
            return
        missing = uncovered(self.bindings.rules(who.name, who.groups), wanted)
        if missing is not None:
            raise Denied("escalation", f"{subject} may not {act}: it would grant {missing}, which no binding "
                         f"grants {who.name}")

    @staticmethod
    def _gitsource_reach(subject: str, act: Action, src: GitSource) -> None:
        """A file:// URL reads a repository of the controller-manager's host (under its
        --git-file-root): a user neither sets one nor changes the url of a source that has one.
        Admins may. (A secretRef names a file of the credentials directory only: llmgw/api/git.py.)"""
        if src.spec.url.startswith("file://") and (act.fields is None or "spec.url" in act.fields):
            raise Denied("gitsource-file-url", f"{subject} may not {act}: spec.url: only an admin sets a "
                         "file:// url, or the url of a GitSource that has one")

    @staticmethod
    def _component(who: Identity, act: Action) -> None:
        if who.name == "controller-manager":
            return
        if who.name == "gateway":
            if act.verb in READ and act.kind in ("models", "replicas", "nodes", "apikeys", "adapters") \
                    or act.kind == "demand":
                return
            raise Denied("gateway-read", f"the gateway may only get, list and watch models, replicas, nodes, "
                         f"apikeys and adapters; it asked to {act}")
        raise Denied("component", f"unknown component {who.name!r} (known: controller-manager, gateway)")

    async def _node(self, who: Identity, act: Action) -> None:
        me = who.name

        def claims(other: str | None, rule: str, what: str) -> Denied:
            return Denied(rule, f"certificate CN={me} may {what} only as node {me}, not {other}",
                          log_line=f"refused: certificate CN={me} claims node {other}")

        if act.verb == "log":
            if act.node not in (None, me):
                raise claims(act.node, "node-logs", "read engine logs")
            if act.obj_node == me or act.unknown(act.obj_node):
                return
            raise Denied("node-logs", f"node {me} may read the engine logs of its own shards only; "
                         f"{act.kind}/{act.name} runs on node {act.obj_node}",
                         log_line=f"refused: certificate CN={me} asked for the log of {act.kind}/{act.name} "
                                  f"on node {act.obj_node}")
        if act.kind == "nodes":
            if act.verb == "list":
                if act.weights:
                    return  # the Nodes that hold or pull the weights it pulls (its peers), from the index
                raise Denied("node-list", f"node {me} may not list the fleet's Nodes; it asks the weights index "
                             "for the peers of a pull (GET nodes?weights=SOURCE)")
            if act.verb not in ("get", "create", "update", "status", "apply"):
                raise Denied("node-self", f"node {me} may only ask the weights index for Nodes, and get, register "
                             f"and write the status of its own Node; it asked to {act}")
            if act.name != me and not act.unknown(act.name):
                raise claims(act.name, "node-self", "read and write a Node")
            return self._own_node(me, act)
        if act.kind == "heartbeat":
            if act.name != me:
                raise claims(act.name, "node-heartbeat", "heartbeat")
            return
        if act.kind == "shards":
            if act.verb in ("list", "watch"):
                if act.node is None:
                    raise Denied("node-shards", f"node {me} must {act.verb} shards with node={me}")
                if act.node != me:
                    raise claims(act.node, "node-shards", f"{act.verb} shards")
                return
            if act.verb in ("get", "status"):
                if act.node is not None and act.node != me:
                    raise claims(act.node, "node-shards", "read shards")
                if act.obj_node != me and not act.unknown(act.obj_node):
                    raise Denied("node-shards", f"node {me} may only read and write the status of shards "
                                 f"bound to it; shards/{act.name} is bound to {act.obj_node}")
                return
            raise Denied("node-shards", f"node {me} may only get, list, watch shards bound to it and write "
                         f"their status; it asked to {act}")
        if act.kind == "adapters" and act.verb in READ:
            return      # the adapters placed on its engines: the agent loads them (llmgw/agent/adapters.py)
        if act.kind in ("models", "replicas"):
            if act.verb == "get":
                models, replicas = await self._referenced(me)
                if act.name in (models if act.kind == "models" else replicas):
                    return
                raise Denied("node-shard-refs", f"node {me} may only get {act.kind} that its own shards "
                             f"reference; no shard on {me} references {act.kind}/{act.name}")
            raise Denied("node-shard-refs", f"node {me} may only get the models and replicas of its shards; "
                         f"it asked to {act}")
        if act.kind == "events" and act.verb == "events-write":
            if act.obj_node == me or act.unknown(act.obj_node):
                return
            raise Denied("node-events", f"node {me} may only record events about itself and its shards")
        raise Denied("node", f"a node certificate may not {act}")

    @staticmethod
    def _own_node(me: str, act: Action) -> None:
        if act.verb == "get":
            return
        if act.verb in ("update", "apply"):
            raise Denied("node-spec", f"node {me} may not change its Node's spec, labels, annotations or "
                         "finalizers (they are the admins' and the controllers'); it may write the agent's "
                         "status fields and heartbeat")
        allowed = NODE_CREATE_FIELDS if act.verb == "create" else NODE_STATUS_FIELDS
        extra = sorted(act.fields - allowed) if act.fields is not None else []
        if extra:
            rule = "node-registration" if act.verb == "create" else "node-status"
            raise Denied(rule, f"node {me} may not set {', '.join(extra)} of its Node; it may set "
                         f"{', '.join(sorted(allowed))}")

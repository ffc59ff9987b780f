"""Who may do what, for a person's certificate (issue 51; docs/contracts.md, "Roles"): the built-in
roles, the decision of a rule against a request, the escalation check, and the index of the
stored Roles and RoleBindings the server answers from.

A user certificate (O=its groups, OU=llmgw:users, llmgw/pki/identity.py) holds the rules of every
Role bound to its CN (a User subject) or to one of its groups (Group subjects). A request asks for
one of a set of rule verbs on a kind (`rule_verbs`: a Node update that sets only
spec.unschedulable is a `cordon`, allowed by `update` too), on an object whose name and labels
are known once it is read. A rule allows it when it names the verb and the kind (or "*"), and,
when it has them, the object's name and a label selector that the object's labels match before
and after the change. Rules with names or a selector never grant a list or a watch.

The index follows etcd by a reflector per kind (llmgw.reflector), so no request reads etcd to be
authorized; it may trail a write to a Role or a RoleBinding by the watch's delay.
"""
from __future__ import annotations

import asyncio
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Generic

from llmgw.api.client import EventType
from llmgw.api.meta import ObjectMeta
from llmgw.api.selectors import Selector
from llmgw.api.types import ANY, EVENTS, KINDS, RULE_VERBS, ObjectT, PolicyRule, Role, RoleBinding, RoleSpec
from llmgw.api.wellknown import BUILTIN_ROLE_LABEL, RECONCILE_REQUESTED_AT
from llmgw.backoff import Backoff
from llmgw.reflector import Reflector
from llmgw.store import Store
from llmgw.store.listwatch import after_store_error_never_raise

READ_VERBS = ["get", "list", "watch"]


def _rule(verbs: list[str], kinds: list[str]) -> PolicyRule:
    return PolicyRule(verbs=verbs, kinds=kinds)


def _builtin(name: str, rules: list[PolicyRule]) -> Role:
    return Role(metadata=ObjectMeta(name=name, labels={BUILTIN_ROLE_LABEL: "true"}), spec=RoleSpec(rules=rules))


# view: read everything but the API keys; operate: view, and cordon, drain, scale, the engine logs,
# a GitSource's reconcile (and suspend, resume); edit: operate, and write Models and GitSources;
# admin: everything.
_VIEW = [_rule(READ_VERBS, [k for k in KINDS if k != "apikeys"] + [EVENTS])]
_OPERATE = [*_VIEW, _rule(["cordon", "drain"], ["nodes"]), _rule(["scale"], ["models"]),
            _rule(["logs"], ["shards", "replicas"]), _rule(["reconcile"], ["gitsources"])]
_EDIT = [*_OPERATE, _rule(["create", "update", "patch", "delete"], ["models", "gitsources"])]
BUILTIN_ROLES: dict[str, Role] = {r.name: r for r in (
    _builtin("view", _VIEW), _builtin("operate", _OPERATE), _builtin("edit", _EDIT),
    _builtin("admin", [_rule([ANY], [ANY])]))}

# The fields an update may set under a narrower verb than `update`, by kind.
_NARROW: dict[str, list[tuple[str, frozenset[str]]]] = {
    "nodes": [("cordon", frozenset({"spec.unschedulable"})),
              ("drain", frozenset({"spec.unschedulable", "spec.drain"}))],
    "models": [("scale", frozenset({"spec.replicas", "spec.autoscaling"}))],
    "gitsources": [("reconcile", frozenset({"spec.suspend", f"metadata.annotations.{RECONCILE_REQUESTED_AT}"}))],
}


def narrowed(kind: str, verb: str) -> frozenset[str] | None:
    """The fields an update of `kind` sets under the narrower `verb` (None: it has none such)."""
    return next((fields for v, fields in _NARROW.get(kind, ()) if v == verb), None)


def rule_verbs(verb: str, kind: str, fields: frozenset[str] | None = None) -> frozenset[str]:
    """The rule verbs any one of which allows the server's `verb` (llmgw/server/authz.py's Action)
    on `kind`; `fields`: what an update sets (None: not known yet, so any narrower verb may do)."""
    if verb == "update":
        narrow = {v for v, allowed in _NARROW.get(kind, ()) if fields is None or fields <= allowed}
        return frozenset({"update", *narrow})
    if verb == "apply":
        return frozenset({"patch"})
    if verb == "log":
        return frozenset({"logs"})
    if verb == "events-read":
        return frozenset({"list", "watch"})
    if verb == "events-write":
        return frozenset({"create"})
    return frozenset({verb}) if verb in RULE_VERBS else frozenset()


@dataclass(frozen=True)
class Target:
    """What a request touches, as much as is known: the object's name, its labels before and after
    the change (None: not known yet, or no such object)."""
    name: str | None = None
    labels: Mapping[str, str] | None = None
    new_labels: Mapping[str, str] | None = None


def _selects(rule: PolicyRule, target: Target, final: bool) -> bool:
    if rule.names and not (target.name in rule.names or (not final and target.name is None)):
        return False
    if rule.labelSelector is None:
        return True
    if target.labels is None and target.new_labels is None:
        return not final   # the object's labels are known once it is read
    selector = Selector.parse(rule.labelSelector)
    return all(selector.matches(dict(labels)) for labels in (target.labels, target.new_labels) if labels is not None)


def allows(rule: PolicyRule, verbs: Iterable[str], kind: str, target: Target, final: bool = True) -> bool:
    """Whether `rule` grants one of `verbs` on `kind`'s object `target` (`final` false: what is not
    known yet is taken as it may turn out)."""
    if ANY not in rule.kinds and kind not in rule.kinds:
        return False
    if ANY not in rule.verbs and not any(v in rule.verbs for v in verbs):
        return False
    return _selects(rule, target, final)


def _requirements(selector: str | None) -> frozenset[str]:
    return frozenset(str(r) for r in Selector.parse(selector).requirements) if selector else frozenset()


def covers(held: PolicyRule, wanted: PolicyRule) -> bool:
    """Whether `held` grants all that `wanted` does (the escalation check): every verb and kind of
    it, on no more names, under a selector that asks no less."""
    def within(mine: list[str], theirs: list[str]) -> bool:
        return ANY in mine or (ANY not in theirs and set(theirs) <= set(mine))

    if not (within(held.verbs, wanted.verbs) and within(held.kinds, wanted.kinds)):
        return False
    if held.names and not (wanted.names and set(wanted.names) <= set(held.names)):
        return False
    return _requirements(held.labelSelector) <= _requirements(wanted.labelSelector)


def uncovered(held: list[PolicyRule], wanted: Iterable[PolicyRule]) -> PolicyRule | None:
    """The first rule of `wanted` that no single rule of `held` covers; None: `held` grants them all."""
    return next((w for w in wanted if not any(covers(h, w) for h in held)), None)


class _Follow(Generic[ObjectT]):
    """Every stored object of one kind, by name, kept current by a reflector."""

    def __init__(self, store: Store, kind: type[ObjectT], on_change: "Bindings") -> None:
        self.items: dict[str, ObjectT] = {}
        self.synced = asyncio.Event()
        self._on_change = on_change
        self.reflector = Reflector(store.lister_watcher(kind, after_store_error_never_raise), self._change,
                                   key=lambda o: o.name, known=lambda: self.items.values(),
                                   on_synced=self.synced.set, backoff=Backoff(0.1, 5.0),
                                   name=f"{kind.kind_plural} index")

    def _change(self, type_: EventType, obj: ObjectT, revision: int) -> None:
        if type_ == "DELETED":
            self.items.pop(obj.name, None)
        else:
            self.items[obj.name] = obj
        self._on_change.changed()


class Bindings:
    """The stored Roles and RoleBindings, and each subject's rules, answered from memory."""

    def __init__(self, store: Store) -> None:
        self._roles = _Follow(store, Role, self)
        self._bindings = _Follow(store, RoleBinding, self)
        self._rules: dict[tuple[str, str], list[PolicyRule]] = {}   # by (User|Group, name), built on demand
        self._tasks: list[asyncio.Task[None]] = []

    async def run(self) -> None:
        """Follow both kinds; returns once both are listed (they go on being followed)."""
        self._tasks = [asyncio.create_task(f.reflector.run()) for f in (self._roles, self._bindings)]
        await asyncio.gather(self._roles.synced.wait(), self._bindings.synced.wait())

    async def stop(self) -> None:
        for t in self._tasks:
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    def changed(self) -> None:
        self._rules.clear()

    def role(self, name: str) -> Role | None:
        """A built-in role, or a stored one."""
        return BUILTIN_ROLES.get(name) or self._roles.items.get(name)

    def _subject_rules(self, kind: str, name: str) -> list[PolicyRule]:
        rules = self._rules.get((kind, name))
        if rules is None:
            rules = [rule for b in self._bindings.items.values()
                     if any(s.kind == kind and s.name == name for s in b.spec.subjects)
                     for rule in self.rules_of_role(b.spec.roleRef.name)]
            self._rules[(kind, name)] = rules
        return rules

    def rules_of_role(self, name: str) -> list[PolicyRule]:
        role = self.role(name)
        return role.spec.rules if role is not None else []

    def rules(self, user: str, groups: Iterable[str]) -> list[PolicyRule]:
        """Every rule bound to the user or one of its groups."""
        out = list(self._subject_rules("User", user))
        for g in groups:
            out.extend(self._subject_rules("Group", g))
        return out

    def bound(self, user: str, groups: Iterable[str]) -> list[str]:
        """The names of the bindings naming the user or one of its groups (`auth whoami`)."""
        wanted = {("User", user), *(("Group", g) for g in groups)}
        return sorted(b.name for b in self._bindings.items.values()
                      if any((s.kind, s.name) in wanted for s in b.spec.subjects))

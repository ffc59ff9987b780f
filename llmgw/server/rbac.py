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
import functools
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Generic, NamedTuple, TypeVar

from llmgw.api import ANY, EVENTS, KINDS, RULE_VERBS, ObjectT, PolicyRule, Role, RoleBinding, RoleSpec
from llmgw.api.client import EventType
from llmgw.api.meta import ObjectMeta
from llmgw.api.selectors import Selector
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


# view: read everything, an ApiKey's secret hash redacted (llmgw/server/authz.py's hides_key_hashes);
# operate: view, and cordon, drain, scale, the engine logs, a GitSource's reconcile (and suspend,
# resume); edit: operate, and write Models and GitSources; admin: everything.
_VIEW = [_rule(READ_VERBS, [*KINDS, EVENTS])]
_OPERATE = [*_VIEW, _rule(["cordon", "drain"], ["nodes"]), _rule(["scale"], ["models"]),
            _rule(["logs"], ["shards", "replicas"]), _rule(["reconcile"], ["gitsources"])]
_EDIT = [*_OPERATE, _rule(["create", "update", "patch", "delete"], ["models", "gitsources", "adapters"])]
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


@functools.lru_cache(maxsize=1024)
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
    return frozenset({verb}) if verb in RULE_VERBS else frozenset({ANY})   # one no rule names: "*" alone


class Target(NamedTuple):
    """What a request touches, as much as is known: the object's name, its labels before and after
    the change (None: not known yet, or no such object)."""
    name: str | None = None
    labels: Mapping[str, str] | None = None
    new_labels: Mapping[str, str] | None = None


@functools.lru_cache(maxsize=4096)
def _selector(text: str) -> Selector:
    return Selector.parse(text)


def _matcher(text: str) -> Callable[[Mapping[str, str]], bool]:
    """Whether labels match the selector `text`; one of equalities alone (team=search) is a
    comparison of item views, the cheapest a decision can make."""
    selector = _selector(text)
    if all(r.op == "=" for r in selector.requirements):
        wanted = {r.key: r.value for r in selector.requirements}.items()
        return lambda labels: wanted <= labels.items()
    return lambda labels: selector.matches(dict(labels))


@dataclass(frozen=True)
class Compiled:
    """A rule as a decision reads it: its names a set, its selector a function of labels."""
    rule: PolicyRule
    names: frozenset[str]       # empty: every name
    matches: Callable[[Mapping[str, str]], bool] | None   # None: no selector

    @classmethod
    def of(cls, rule: PolicyRule) -> "Compiled":
        return cls(rule, frozenset(rule.names), _matcher(rule.labelSelector) if rule.labelSelector else None)


def admits(rule: Compiled, target: Target, final: bool = True) -> bool:
    """Whether `rule` (one that grants the request's verb on its kind) allows it on the object
    `target` (`final` false: what is not known yet is taken as it may turn out)."""
    if rule.names and not (target.name in rule.names or (not final and target.name is None)):
        return False
    if rule.matches is None:
        return True
    if target.labels is None and target.new_labels is None:
        return not final   # the object's labels are known once it is read
    return (target.labels is None or rule.matches(target.labels)) and \
        (target.new_labels is None or rule.matches(target.new_labels))


def _requirements(selector: str | None) -> frozenset[str]:
    return frozenset(str(r) for r in _selector(selector).requirements) if selector else frozenset()


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
    """Every stored object of one kind, by name, kept current by a reflector; `on_change(old, new)`
    after each change (None: there was none, it is gone)."""

    def __init__(self, store: Store, kind: type[ObjectT],
                 on_change: Callable[[ObjectT | None, ObjectT | None], None]) -> None:
        self.items: dict[str, ObjectT] = {}
        self.synced = asyncio.Event()
        self._on_change = on_change
        self.reflector = Reflector(store.lister_watcher(kind, after_store_error_never_raise), self.change,
                                   key=lambda o: o.name, known=lambda: self.items.values(),
                                   on_synced=self.synced.set, backoff=Backoff(0.1, 5.0),
                                   name=f"{kind.kind_plural} index")

    def change(self, type_: EventType, obj: ObjectT, revision: int = 0) -> None:
        """One event of the kind (the reflector's, or a benchmark's)."""
        old = self.items.pop(obj.name, None)
        if type_ != "DELETED":
            self.items[obj.name] = obj
        self._on_change(old, None if type_ == "DELETED" else obj)


SubjectKey = tuple[str, str]   # ("User" | "Group", name)
# by kind (or "*") and verb: the rules that grant it; a rule of every verb is under each and "*"
Grants = dict[tuple[str, str], list[Compiled]]
_EVERY_VERB = (*RULE_VERBS, ANY)


def _subjects(b: RoleBinding | None) -> set[SubjectKey]:
    return {(s.kind, s.name) for s in b.spec.subjects} if b is not None else set()


K = TypeVar("K")


def _discard(index: dict[K, set[str]], key: K, name: str) -> None:
    names = index.get(key, set())
    names.discard(name)
    if not names:
        index.pop(key, None)


class Bindings:
    """The stored Roles and RoleBindings, and what each subject is granted, answered from memory:
    each subject's rules by kind and verb are kept current as Roles and RoleBindings change, so a
    decision reads a few dicts for the user and each of its groups, and matches the names and
    selectors of the rules found there alone."""

    def __init__(self, store: Store) -> None:
        self.roles = _Follow(store, Role, self._role_changed)
        self.bindings = _Follow(store, RoleBinding, self._rebind)
        self._by_subject: dict[SubjectKey, set[str]] = {}   # binding names
        self._by_role: dict[str, set[str]] = {}   # binding names, by the role they bind
        self._grants: dict[SubjectKey, Grants] = {}
        self._tasks: list[asyncio.Task[None]] = []

    async def run(self) -> None:
        """Follow both kinds; returns once both are listed (they go on being followed)."""
        self._tasks = [asyncio.create_task(f.reflector.run()) for f in (self.roles, self.bindings)]
        await asyncio.gather(self.roles.synced.wait(), self.bindings.synced.wait())

    async def stop(self) -> None:
        for t in self._tasks:
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    def _rebind(self, old: RoleBinding | None, new: RoleBinding | None) -> None:
        if old is not None:
            for subject in _subjects(old) - _subjects(new):
                _discard(self._by_subject, subject, old.name)
            _discard(self._by_role, old.spec.roleRef.name, old.name)
        if new is not None:
            for subject in _subjects(new):
                self._by_subject.setdefault(subject, set()).add(new.name)
            self._by_role.setdefault(new.spec.roleRef.name, set()).add(new.name)
        for subject in _subjects(old) | _subjects(new):
            self._regrant(subject)

    def _role_changed(self, old: Role | None, new: Role | None) -> None:
        names = {role.name for role in (old, new) if role is not None}
        for subject in {s for name in names for b in self._by_role.get(name, ())
                        for s in _subjects(self.bindings.items[b])}:
            self._regrant(subject)

    def _regrant(self, subject: SubjectKey) -> None:
        """Index what `subject` is granted anew, from its bindings' roles."""
        grants: Grants = {}
        for role in {self.bindings.items[name].spec.roleRef.name for name in self._by_subject.get(subject, ())}:
            for rule in self.rules_of_role(role):
                compiled = Compiled.of(rule)
                for kind in rule.kinds:
                    for verb in _EVERY_VERB if ANY in rule.verbs else rule.verbs:
                        grants.setdefault((kind, verb), []).append(compiled)
        if grants:
            self._grants[subject] = grants
        else:
            self._grants.pop(subject, None)

    def role(self, name: str) -> Role | None:
        """A built-in role, or a stored one."""
        return BUILTIN_ROLES.get(name) or self.roles.items.get(name)

    def rules_of_role(self, name: str) -> list[PolicyRule]:
        role = self.role(name)
        return role.spec.rules if role is not None else []

    def _bound(self, user: str, groups: Iterable[str]) -> set[str]:
        names = set(self._by_subject.get(("User", user), ()))
        for g in groups:
            names.update(self._by_subject.get(("Group", g), ()))
        return names

    def bound(self, user: str, groups: Iterable[str]) -> list[str]:
        """The names of the bindings naming the user or one of its groups (`auth whoami`)."""
        return sorted(self._bound(user, groups))

    def rules(self, user: str, groups: Iterable[str]) -> list[PolicyRule]:
        """Every rule bound to the user or one of its groups (what it holds, for the escalation check)."""
        roles = {self.bindings.items[name].spec.roleRef.name for name in self._bound(user, groups)}
        return [rule for role in roles for rule in self.rules_of_role(role)]

    def granting(self, user: str, groups: Iterable[str], kind: str, verbs: frozenset[str], target: Target,
                 final: bool = True) -> PolicyRule | None:
        """The first rule bound to the user or one of its groups that grants one of `verbs` on
        `kind` and allows it on `target`; None: none does."""
        for subject in (("User", user), *(("Group", g) for g in groups)):
            grants = self._grants.get(subject)
            if grants is not None:
                for verb in verbs:
                    for key in ((kind, verb), (ANY, verb)):
                        for rule in grants.get(key, ()):
                            if admits(rule, target, final):
                                return rule.rule
        return None

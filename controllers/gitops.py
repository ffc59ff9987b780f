"""GitOps by pull: each GitSource keeps the objects of a path of a Git repository applied.

Key: the GitSource's name. At each interval (and at once on a spec change, a
`llmgw reconcile gitsource`, or a dependency becoming Ready) a sync:

1. waits until every source of spec.dependsOn is Ready;
2. fetches the ref with git (controllers/gitfetch.py, a directory per source) in a task
   of its own, off the workers: a fetch may take up to git_timeout (two minutes), and
   other sources sync meanwhile; the fetch's end queues the source again, and the
   steps below run in that reconcile;
3. reads spec.path as `llmgw apply -R` reads a directory (llmgw.api.manifests: the same
   limits and validation). One bad document, or an object defined twice, and nothing is
   applied: Stalled names the file, the document and the field;
4. refuses to write an object that exists without this source's label
   (llmgw.io/gitsource): one applied by hand or by another source is a conflict
   (Stalled, OwnershipConflict), reported and never fought over;
5. applies every object as `llmgw apply` does (llmgw.api.applied: spec, and the labels
   and annotations it names; never status, so the autoscaler's count is not drift).
   An object that equals what the commit says is not written, so a re-sync of an
   unchanged commit writes nothing to etcd; one that differs at the commit already
   applied was edited by hand, and is reverted with a DriftCorrected event naming the
   fields;
6. prunes (spec.prune) what the inventory says it applied before and the commit no
   longer has, and only while the object still carries its label: through the usual
   deletion, so a Model's replicas go make-before-break;
   each object created, changed or pruned is an audit line (`audit`: the controller-manager's
   `--audit-log`/`--audit-webhook`), naming the source (gitSource) and its commit;
7. writes status (lastAppliedRevision, the inventory, Ready, Reconciling, Stalled) only
   when it differs.

Ready is True when the last commit was applied and every Model of it is Available; a
Model's change re-reads that without a fetch. A fetch or write that fails is retried
after the work queue's backoff for the source (llmgw.runtime.workqueue: its rate-limited
requeue, gitops_retry_base doubling to gitops_retry_max).
A deleted source with spec.prune prunes its inventory first (a finalizer), after the
sources that depend on it are gone: dependants are pruned before what they depend on.
"""
from __future__ import annotations

import asyncio
import logging
import tempfile
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Iterable

from controllers.gitfetch import Checkout, GitCache, GitError
from controllers.settings import DEFAULTS, ControllerSettings
from llmgw.api import KIND_BY_NAME, AnyObject, GitSource, Model, condition_true, get_condition
from llmgw.api.applied import applied, applies_nothing, changed_fields
from llmgw.api.errors import NotFound
from llmgw.api.manifests import ManifestError, load_manifests, manifest_files
from llmgw.api.patches import ConditionPatch, GitSourceStatusPatch, InventoryEntryPatch
from llmgw.api.wellknown import GITSOURCE_LABEL, GITSOURCE_PRUNE_FINALIZER, RECONCILE_REQUESTED_AT
from llmgw.runtime.controller import Context, Controller, Result, WatchedKind

log = logging.getLogger("llmgw.controllers.gitops")

# Writes of one sync in flight at once: enough for the store's batcher to group commits
# (2,000 Models in seconds, hack/bench/gitops.py), few enough not to crowd other controllers.
APPLY_CONCURRENCY = 32
# Objects a message names before "and N more".
NAMED = 3


class Stalled(Exception):
    """The commit cannot be applied as it is (a bad manifest, a conflict): wait for a new one."""

    def __init__(self, reason: str, message: str) -> None:
        self.reason, self.message = reason, message
        super().__init__(message)


class Retry(Exception):
    """A failure that may pass (a fetch, a write): tried again after the work queue's backoff."""

    def __init__(self, reason: str, message: str) -> None:
        self.reason, self.message = reason, message
        super().__init__(message)


@dataclass
class _Source:
    """What this term knows of a source between syncs."""
    generation: int
    requested: str | None
    due: float
    loaded: tuple[str, list[AnyObject]] | None = None   # a revision and its objects, parsed once
    # The fetch in flight, or ended and not yet applied, and the (generation, request) it is for.
    fetch: asyncio.Task[Checkout] | None = None
    fetched_for: tuple[int, str | None] | None = None


def _ref(kind: str, name: str) -> str:
    return f"{kind.lower()}/{name}"


def _names(refs: list[str]) -> str:
    more = len(refs) - NAMED
    return ", ".join(refs[:NAMED]) + (f" and {more} more" if more > 0 else "")


def _condition(type: str, ok: bool, reason: str, message: str = "") -> ConditionPatch:
    return {"type": type, "status": "True" if ok else "False", "reason": reason, "message": message}


class GitOpsController(Controller):
    name = "gitops"
    watches = (GitSource, Model)
    workers = 2

    def __init__(self, settings: ControllerSettings = DEFAULTS, cache_dir: Path | None = None,
                 audit: Callable[[dict[str, Any]], None] | None = None) -> None:
        self.settings = settings
        self.audit = audit   # takes an audit line of each write of a source's object
        self.retry_base, self.retry_max = settings.gitops_retry_base, settings.gitops_retry_max
        root = cache_dir or Path(tempfile.gettempdir()) / "llmgw-git"
        self.git = GitCache(root, settings.git_timeout, Path(settings.git_credentials_dir),
                            Path(settings.git_file_root) if settings.git_file_root else None)
        self._sources: dict[str, _Source] = {}

    def start(self, ctx: Context) -> None:
        """Every source syncs at the start of a term: its cache, and the last term's writes, are new."""
        super().start(ctx)
        self._sources = {}

    async def stop(self) -> None:
        """The fetches in flight end with the term (git is killed: gitfetch.py)."""
        fetches = [st.fetch for st in self._sources.values() if st.fetch is not None]
        for fetch in fetches:
            fetch.cancel()
        await asyncio.gather(*fetches, return_exceptions=True)

    def keys_for(self, kind: WatchedKind, obj: AnyObject | str) -> Iterable[str]:
        if type(obj) is GitSource:
            # itself, what waits on it (its Ready), and what it waits on (its deletion lets them prune)
            return [obj.name, *obj.spec.dependsOn,
                    *(s.name for s in self.ctx.cache.list(GitSource) if obj.name in s.spec.dependsOn)]
        if type(obj) is Model:
            owner = obj.metadata.labels.get(GITSOURCE_LABEL)
            return [owner] if owner else []
        return []

    async def reconcile(self, key: str) -> Result | None:
        src = self.ctx.cache.get(GitSource, key)
        if src is None:
            gone = self._sources.pop(key, None)
            if gone is not None and gone.fetch is not None and not gone.fetch.done():
                gone.fetch.cancel()    # its end (git killed) forgets the directory, unless the name is back
                gone.fetch.add_done_callback(lambda _: None if key in self._sources else self.git.forget(key))
            else:
                self.git.forget(key)
            return None
        if src.metadata.deletionTimestamp is not None:
            return await self._finalize(src)
        if src.spec.prune and GITSOURCE_PRUNE_FINALIZER not in src.metadata.finalizers:
            src = await self._add_finalizer(src)
        now = self.ctx.clock()
        requested = src.metadata.annotations.get(RECONCILE_REQUESTED_AT)
        wanted = (src.metadata.generation, requested)
        st = self._sources.get(key)
        if st is None or (st.generation, st.requested) != wanted:
            st = self._sources[key] = _Source(*wanted, now, st.loaded if st else None,
                                              st.fetch if st else None, st.fetched_for if st else None)
        if st.fetch is not None:
            if not st.fetch.done():
                return Result(keep_backoff=True)    # its end queues the source again
            if st.fetched_for != wanted or src.spec.suspend:
                if not st.fetch.cancelled():
                    st.fetch.exception()   # retrieved: what failed for a spec changed since is not logged
                st.fetch = None            # of a spec changed since: fetched again below
        if src.spec.suspend:
            await self._patch(src, {"lastHandledReconcileAt": requested, "conditions": [_condition(
                "Reconciling", False, "Suspended", "spec.suspend is true: no change is applied")]})
            return None
        if st.fetch is None:
            return await self._start_fetch(src, st, now)
        fetch, st.fetch = st.fetch, None
        try:
            await self._sync(src, st, fetch)
            if requested is not None:
                await self._patch(self.ctx.cache.get(GitSource, src.name) or src, {"lastHandledReconcileAt": requested})
        except Retry as err:
            delay = self.ctx.queue.add_rate_limited(key)
            st.due = self.ctx.clock() + delay
            log.warning("gitsource %s: %s; next try in %.1f s", key, err.message, delay)
            await self._patch(src, {"conditions": [
                _condition("Ready", False, err.reason, err.message),
                _condition("Reconciling", True, err.reason, f"{err.message}; next try in {delay:.0f} s")]})
            return Result(keep_backoff=True)
        st.due = self.ctx.clock() + src.spec.interval_seconds
        return Result(requeue_after=float(src.spec.interval_seconds))

    async def _start_fetch(self, src: GitSource, st: _Source, now: float) -> Result:
        """A fetch off the workers, if the source is due and what it depends on is Ready."""
        if now < st.due:       # not due: a Model's change, or this source's own status write
            await self._patch(src, {"conditions": [self._health(src)]})
            return Result(requeue_after=st.due - now, keep_backoff=True)
        waiting = self._dependencies_not_ready(src)
        if waiting:
            await self._patch(src, {"conditions": [
                _condition("Reconciling", True, "DependencyNotReady", f"waiting for {_names(waiting)} to be Ready")]})
            # a dependency's own change wakes this one (keys_for); the interval is a safety net
            return Result(requeue_after=float(src.spec.interval_seconds))
        spec, queue = src.spec, self.ctx.queue
        st.fetched_for = (st.generation, st.requested)
        st.fetch = asyncio.create_task(self.git.fetch(src.name, spec.url, spec.ref,
                                                      spec.secretRef.file if spec.secretRef else None))
        st.fetch.add_done_callback(lambda _: queue.add(src.name))
        return Result(keep_backoff=True)   # a retry's fetch: no success yet

    # ------------------------------------------------------------------ sync

    async def _sync(self, src: GitSource, st: _Source, fetch: asyncio.Task[Checkout]) -> None:
        spec = src.spec
        try:
            checkout = fetch.result()
        except GitError as err:
            raise Retry("FetchFailed", f"{spec.url} {spec.ref}: {err}") from None
        rev = checkout.revision
        try:
            if st.loaded is None or st.loaded[0] != rev:
                st.loaded = None
                st.loaded = (rev, self._load(checkout.root, spec.path))
            objects = st.loaded[1]
            self._check_ownership(src, objects)
        except Stalled as err:
            await self._patch(src, {"lastAttemptedRevision": rev, "conditions": [
                _condition("Ready", False, err.reason, f"revision {rev[:12]}: {err.message}"),
                _condition("Reconciling", False, err.reason),
                _condition("Stalled", True, err.reason, f"revision {rev[:12]}: {err.message}")]})
            return
        created, configured = await self._apply(src, objects, rev)
        kept = {(o.kind, o.name) for o in objects}
        gone = [(e.kind, e.name) for e in src.status.inventory if (e.kind, e.name) not in kept]
        pruned = await self._prune(src, gone, rev) if spec.prune else []
        inventory: list[InventoryEntryPatch] = [{"kind": k, "name": n} for k, n in sorted(kept)]
        if created or configured or pruned:
            self.ctx.events.record(src, "Normal", "Applied", f"revision {rev[:12]}: {len(created)} created, "
                                   f"{len(configured)} configured, {len(pruned)} pruned")
        health = self._health(src, applied_revision=rev, inventory=kept)
        await self._patch(src, {"lastAppliedRevision": rev, "lastAttemptedRevision": rev, "inventory": inventory,
                                "conditions": [health, _condition("Reconciling", False, "Synced"),
                                               _condition("Stalled", False, "Synced")]})

    def _load(self, root: Path, path: str) -> list[AnyObject]:
        where = root / path
        if not where.exists():
            raise Stalled("PathNotFound", f"spec.path {path or '.'!r} is not in the commit")
        if where.is_dir() and not manifest_files(where, recursive=True):
            raise Stalled("NoManifests", f"spec.path {path or '.'!r} holds no .yaml, .yml or .json files")
        try:
            return [obj for _, obj in load_manifests([where], recursive=True)]
        except ManifestError as err:
            for e in err.errors:    # name files as the repository does, not the cache directory
                e.file = str(Path(e.file).relative_to(root))
            raise Stalled("InvalidManifest", f"nothing applied: {err}".replace("\n", "; ")) from None

    def _check_ownership(self, src: GitSource, objects: list[AnyObject]) -> None:
        taken = []
        for obj in objects:
            live = self.ctx.cache.get(type(obj), obj.name)
            owner = live.metadata.labels.get(GITSOURCE_LABEL) if live is not None else src.name
            if owner != src.name:
                held = f"GitSource {owner}" if owner else "no GitSource (applied by hand)"
                taken.append(f"{_ref(obj.kind, obj.name)} (held by {held})")
        if taken:
            raise Stalled("OwnershipConflict", f"nothing applied: {_names(taken)} exist without the label "
                          f"{GITSOURCE_LABEL}={src.name}")

    async def _apply(self, src: GitSource, objects: list[AnyObject], rev: str) -> tuple[list[str], list[str]]:
        created: list[str] = []
        configured: list[str] = []
        limit = asyncio.Semaphore(APPLY_CONCURRENCY)
        hand_edit = rev == src.status.lastAppliedRevision   # the same commit again: a difference is drift

        async def one(obj: AnyObject) -> None:
            live = self.ctx.cache.get(type(obj), obj.name)
            if live is not None and live.metadata.deletionTimestamp is not None:
                raise Retry("Terminating", f"{_ref(obj.kind, obj.name)} is being deleted; applied once it is gone")
            # the common case of a re-sync, checked without a copy: nothing to write
            if live is not None and live.metadata.labels.get(GITSOURCE_LABEL) == src.name \
                    and applies_nothing(live, obj):
                return
            manifest = obj.model_copy(deep=True)
            manifest.metadata.labels[GITSOURCE_LABEL] = src.name
            async with limit:
                if live is None:
                    manifest.status = type(obj).model_fields["status"].get_default(call_default_factory=True)
                    self.ctx.cache.assume(self._audited(src, rev, "create", 201, await self.ctx.store.create(manifest)))
                    created.append(obj.name)
                    return
                desired = applied(live, manifest)
                self.ctx.cache.assume(self._audited(src, rev, "update", 200, await self.ctx.store.update(desired)))
                configured.append(obj.name)
                if hand_edit:
                    self.ctx.events.record(live, "Warning", "DriftCorrected",
                                           f"reverted {', '.join(changed_fields(live, desired))} to revision "
                                           f"{rev[:12]} of GitSource {src.name}")

        results = await asyncio.gather(*(one(o) for o in objects), return_exceptions=True)
        failed = [r for r in results if isinstance(r, BaseException)]
        for r in failed:
            if isinstance(r, Retry):
                raise r
        if failed:
            raise Retry("ApplyFailed", f"{len(failed)} of {len(objects)} objects were not written: {failed[0]}")
        return created, configured

    def _audited(self, src: GitSource, commit: str | None, verb: str, code: int, written: AnyObject) -> AnyObject:
        """`written`, what the store answered a write of `src`'s with, after its audit line."""
        if self.audit is not None:
            self.audit({"time": datetime.now(timezone.utc).isoformat(timespec="milliseconds"),
                        "requestId": uuid.uuid4().hex, "verb": verb, "kind": written.kind_plural,
                        "name": written.name, "code": code, "revision": written.metadata.resourceVersion,
                        "gitSource": src.name, "commit": commit})
        return written

    async def _prune(self, src: GitSource, gone: list[tuple[str, str]], commit: str | None) -> list[str]:
        """Delete what this source applied before and no longer has (at `commit`; None: the source
        is deleted), if it still carries its label."""
        pruned = []
        for kind_name, name in gone:
            kind = KIND_BY_NAME.get(kind_name)
            live = self.ctx.cache.get(kind, name) if kind is not None else None
            if kind is None or live is None or live.metadata.labels.get(GITSOURCE_LABEL) != src.name:
                continue                       # gone already, or no longer this source's
            if live.metadata.deletionTimestamp is None:
                try:
                    self.ctx.cache.assume_deletion(self._audited(src, commit, "delete", 200,
                                                                 await self.ctx.store.delete(kind, name)))
                except NotFound:
                    continue
                except Exception as err:
                    raise Retry("PruneFailed", f"{_ref(kind_name, name)}: {err}") from err
            pruned.append(_ref(kind_name, name))
        if pruned:
            self.ctx.events.record(src, "Normal", "Pruned", f"deleted {_names(pruned)}: no longer in the commit")
        return pruned

    # ----------------------------------------------------------- deletion

    async def _add_finalizer(self, src: GitSource) -> GitSource:
        updated = src.model_copy(deep=True)
        updated.metadata.finalizers.append(GITSOURCE_PRUNE_FINALIZER)
        written = await self.ctx.store.update(updated)
        self.ctx.cache.assume(written)
        return written

    async def _finalize(self, src: GitSource) -> Result | None:
        if GITSOURCE_PRUNE_FINALIZER not in src.metadata.finalizers:
            return None
        dependants = [s.name for s in self.ctx.cache.list(GitSource) if src.name in s.spec.dependsOn]
        if dependants:        # they prune first; each one's going enqueues this source (keys_for)
            await self._patch(src, {"conditions": [_condition(
                "Reconciling", True, "DependantsExist", f"pruned once {_names(dependants)} are gone")]})
            return None
        inventory = [(e.kind, e.name) for e in src.status.inventory]
        if src.spec.prune:
            await self._prune(src, inventory, None)
        done = src.model_copy(deep=True)
        done.metadata.finalizers.remove(GITSOURCE_PRUNE_FINALIZER)
        try:
            await self.ctx.store.update(done)
        except NotFound:
            pass
        return None

    # ------------------------------------------------------------- status

    def _dependencies_not_ready(self, src: GitSource) -> list[str]:
        waiting = []
        for dep in src.spec.dependsOn:
            other = self.ctx.cache.get(GitSource, dep)
            if other is None or other.metadata.deletionTimestamp is not None \
                    or not condition_true(other.status.conditions, "Ready"):
                waiting.append(f"gitsource/{dep}")
        return waiting

    def _health(self, src: GitSource, applied_revision: str | None = None,
                inventory: set[tuple[str, str]] | None = None) -> ConditionPatch:
        """Ready: the commit applied and every Model of it Available (a stalled source stays not Ready)."""
        stalled = get_condition(src.status.conditions, "Stalled")
        if applied_revision is None:
            if stalled is not None and stalled.status == "True":
                return _condition("Ready", False, stalled.reason, stalled.message)
            applied_revision = src.status.lastAppliedRevision
        if applied_revision is None:
            return _condition("Ready", False, "NotApplied", "no commit applied yet")
        names = inventory if inventory is not None else {(e.kind, e.name) for e in src.status.inventory}
        waiting = []
        for kind, name in sorted(names):
            if kind != "Model":
                continue
            m = self.ctx.cache.get(Model, name)
            if m is None or m.status.observedGeneration != m.metadata.generation \
                    or not condition_true(m.status.conditions, "Available"):
                waiting.append(_ref(kind, name))
        if waiting:
            return _condition("Ready", False, "Progressing", f"revision {applied_revision[:12]} applied; waiting "
                                                             f"for {_names(waiting)} to be Available")
        return _condition("Ready", True, "Applied", f"revision {applied_revision[:12]} applied and Available")

    async def _patch(self, src: GitSource, patch: GitSourceStatusPatch) -> None:
        """Write the fields that differ, and nothing when none does (a no-op sync writes nothing)."""
        current = src.status
        changed: GitSourceStatusPatch = {}
        for k, v in patch.items():
            if k == "conditions":
                conds = [c for c in patch["conditions"] if not self._same_condition(src, c)]
                if conds:
                    changed["conditions"] = conds
            elif k == "inventory":
                wanted = [(e["kind"], e["name"]) for e in patch["inventory"]]
                if [(e.kind, e.name) for e in current.inventory] != wanted:
                    changed["inventory"] = patch["inventory"]
            elif getattr(current, k) != v:
                changed[k] = v  # type: ignore[literal-required]
        if src.status.observedGeneration != src.metadata.generation:
            changed["observedGeneration"] = src.metadata.generation
        if changed:
            self.ctx.cache.assume(await self.ctx.store.patch_status(GitSource, src.name, changed, current=src))

    @staticmethod
    def _same_condition(src: GitSource, c: ConditionPatch) -> bool:
        cur = get_condition(src.status.conditions, c["type"])
        return cur is not None and (cur.status, cur.reason, cur.message) == (
            c["status"], c.get("reason", ""), c.get("message", ""))

"""Well-known labels, annotations and finalizers: the names controllers use to cooperate.

Shared by the model and replica controllers (controllers/model.py,
controllers/replica.py) and the drain / node-lifecycle controllers
(controllers/drain.py, controllers/nodelifecycle.py); they are part of the API
(an operator or another tool may read or select by them), so they live here.

Drain cooperation (make-before-break):

1. The drain controller creates a replacement Replica for an original on the
   draining node.  The replacement carries
   ``DRAINING_REPLACEMENT_FOR: <original replica name>`` plus the usual model
   label, owner reference and finalizer (copy them from the original), and the
   original's ``spec`` except ``placement`` (same templateHash/profileIndex).
2. Once the replacement is Ready, the drain controller deletes the original
   (or, to let it stop first, marks it with ``EVICT: <reason>`` and deletes it).
3. While any replica of a model carries ``DRAINING_REPLACEMENT_FOR`` or ``EVICT``
   the model controller tolerates replicas beyond ``spec.replicas``: it never
   scales down a replica carrying either annotation nor the original named by a
   ``DRAINING_REPLACEMENT_FOR`` annotation, and it does not count an ``EVICT``-marked
   replica towards the desired count.  An ``EVICT``-marked replica that no
   replica names in ``DRAINING_REPLACEMENT_FOR`` is handled by the model
   controller itself, make-before-break: it creates a new replica, and deletes
   the evicted one once the model has ``spec.replicas - maxUnavailable`` other
   Ready replicas (at once if the evicted one is not Ready).  So marking a
   replica with ``EVICT`` alone is a complete way to move it.
4. When the original is gone the drain controller removes
   ``DRAINING_REPLACEMENT_FOR`` from the replacement (optional: the model
   controller treats an annotation naming a vanished replica as inert).
"""

# On a replacement replica: the name of the replica it replaces.
DRAINING_REPLACEMENT_FOR = "llmgw.io/draining-replacement-for"

# On a replica that must leave its node: why (e.g. "drain", "node-lost").
EVICT = "llmgw.io/evict"

# Label on every replica of a model, and on every shard of one.
MODEL_LABEL = "llmgw.io/model"

# Label on every shard of a replica.
REPLICA_LABEL = "llmgw.io/replica"


def shard_name(replica: str, rank: int) -> str:
    """A replica's shard of `rank` (the replica controller names them; `llmgw logs REPLICA` finds them)."""
    return f"{replica}-{rank}"


# Finalizers.
SHARDS_FINALIZER = "llmgw.io/shards"      # on a Replica: its shards are gone
PROCESS_FINALIZER = "llmgw.io/process"    # on a Shard: the agent stopped its process

# GitOps (controllers/gitops.py). Label on every object a GitSource applied: the source's name.
# An object that carries another source's name, or none, is not the source's to write: a conflict.
GITSOURCE_LABEL = "llmgw.io/gitsource"
# On a GitSource: set it (to any new value, `llmgw reconcile gitsource` sets the time) to sync now.
RECONCILE_REQUESTED_AT = "llmgw.io/reconcile-requested-at"
# On a GitSource with spec.prune: its inventory is pruned before it goes.
GITSOURCE_PRUNE_FINALIZER = "llmgw.io/gitsource-prune"

# The label of the server's built-in roles (view, operate, edit, admin: llmgw/server/rbac.py).
BUILTIN_ROLE_LABEL = "llmgw.io/builtin"

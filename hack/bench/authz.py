"""What deciding a user's request costs the API server (issue 51), in-process: the authorizer
(llmgw/server/authz.py) over the index of Roles and RoleBindings (llmgw/server/rbac.py), fed
the objects as its watch would feed them (no etcd is reached: the Store is never connected).

`--roles` Roles of three rules each (reads of models and replicas; update and scale of the
models labelled team=T; the logs of named shards), `--bindings` RoleBindings, each binding one
user to a role, every tenth one a group as well; each user is in two groups. Then `--decisions`
requests of random users, half of which are granted, half refused (a delete no rule grants),
each timed alone. A decision reads, for the user and each of its groups, the rules indexed under
the request's kind (and "*") and verb, kept current as Roles and RoleBindings change, and
matches only their names and selectors (a selector of equalities is one comparison of item
views).

    .venv/bin/python hack/bench/authz.py

Figures (the shared 2-core development machine, heavily loaded: load average 13-17 from six
other sessions' tests, 2026-12-06; 100,000 decisions; main's code and this one run in turn,
four times):
    before (a subject's rules by kind found on its first request, then kept until any change;
    every rule's verbs tested; the selector matched through Selector.matches):
        decision_us_p50=7.2-7.7 decision_us_p99=34-82
    now: decision_us_p50=6.3-7.1 decision_us_p99=25-67 (one run 326)
The p99 on this machine is the scheduler's, not the decision's: 0.6% of the decisions took 0.2
to 12 ms (preempted: p99.5=0.7 ms, p99.9=12 ms), and about 2% more 20-60 us of CPU time (timed
by thread_time: p99=37 us), what a decision that finds its caches cold after another process ran
pays. One user's decision timed in a loop (warm caches): p50=3.3 us p99=4-8 us granted, p50=5.7
us refused (a refusal builds its 403 message). So the target (p99 at most 20 us) is not shown
here: it wants a quieter machine to be measured; the best run on this one gave 20.8 us.
The same machine quiet (no other session's tests, load under 1), three runs in a row, this code:
    decision_us_p50=6.3-11.2 decision_us_p99=17.5-18.9    (target p99 at most 20 us: met)
"""
from __future__ import annotations

import argparse
import asyncio
import random
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from llmgw.api import parse_object
from llmgw.pki import Identity
from llmgw.server.authz import Action, Authorizer, Denied
from llmgw.server.rbac import Bindings
from llmgw.store import Store

V1 = "llmgw.io/v1"


def role(i: int):  # type: ignore[no-untyped-def]
    return parse_object({"apiVersion": V1, "kind": "Role", "metadata": {"name": f"r{i}"}, "spec": {"rules": [
        {"verbs": ["get", "list", "watch"], "kinds": ["models", "replicas"]},
        {"verbs": ["update", "scale"], "kinds": ["models"], "labelSelector": f"team=t{i}"},
        {"verbs": ["logs"], "kinds": ["shards"], "names": [f"s{i}-{k}" for k in range(4)]}]}})


def binding(j: int, roles: int):  # type: ignore[no-untyped-def]
    subjects = [{"kind": "User", "name": f"u{j}"}] + ([{"kind": "Group", "name": f"g{j // 10}"}] if j % 10 == 0 else [])
    return parse_object({"apiVersion": V1, "kind": "RoleBinding", "metadata": {"name": f"b{j}"},
                         "spec": {"roleRef": {"name": f"r{j % roles}"}, "subjects": subjects}})


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--roles", type=int, default=100)
    ap.add_argument("--bindings", type=int, default=1000)
    ap.add_argument("--decisions", type=int, default=100000)
    args = ap.parse_args()
    bindings = Bindings(Store("http://127.0.0.1:1"))
    for i in range(args.roles):
        bindings.roles.change("ADDED", role(i))
    for j in range(args.bindings):
        bindings.bindings.change("ADDED", binding(j, args.roles))

    async def referenced(node: str) -> tuple[set[str], set[str]]:
        return set(), set()

    authz = Authorizer(referenced, bindings)
    now = datetime.now(timezone.utc)
    rng = random.Random(51)
    times = []
    for n in range(args.decisions):
        j = rng.randrange(args.bindings)
        groups = (f"g{j % (args.bindings // 10)}", f"g{(j + 7) % (args.bindings // 10)}")
        who = Identity("user", f"u{j}", "", "1", now, now, groups)
        team = {"team": f"t{j % args.roles}"}
        act = (Action("update", "models", "m", fields=frozenset({"spec.replicas"}), labels=team, new_labels=team)
               if n % 2 == 0 else Action("delete", "models", "m"))
        start = time.perf_counter_ns()
        try:
            await authz.check(who, act)
        except Denied:
            pass
        times.append(time.perf_counter_ns() - start)
    times.sort()
    p50, p99 = times[len(times) // 2] / 1000, times[len(times) * 99 // 100] / 1000
    print(f"authz: bindings={args.bindings} decision_us_p50={p50:.1f} decision_us_p99={p99:.1f}")


if __name__ == "__main__":
    asyncio.run(main())

#!/usr/bin/env python3
"""Control-plane benchmark: every controller against hollow nodes, until all replicas are Ready.

    .venv/bin/python hack/bench/controlplane.py --nodes 1000 --replicas 2200

Starts its own etcd, measures etcd's raw put rate (concurrent store.kv.put of
small values), registers --nodes hollow nodes (llmgw/hollow.py,
in-process: 8 GPUs each, spread over 4 fabrics; they move shards
Pending -> Starting -> Ready), starts a controller manager with every
controller of llmgw.cmd.controller_manager.controllers(), then applies models at once: single-node
replicas (2 GPUs each, 20 models) and two-node replicas (8 GPUs per node,
4 models), --replicas in all, one in eleven of them two-node (2000 + 200 for
2200). A separate connection watches replicas and records when each got its
placement and when it became Ready.

Reports: time until all Ready, binds per second (binds / time from apply to
the last bind), p50/p99 apply-to-Ready, the raw put rate, and last
`binds/s=<n> ratio_to_raw_etcd=<r>`. Targets: >= 500 binds/s, all Ready
within 15 s.

`--backlog` writes the replicas (as the model controller would) before the
controllers start; `--scheduler-only` runs just the scheduler on that backlog,
which is its own bind rate.

By default the controllers run as the real `llmgw controller-manager` in its
own process (`--in-process` keeps them here); the hollow nodes and the
observer share this process.

`--takeover` runs a second `llmgw controller-manager` beside the first, its warm standby
(docs/contracts.md, "Warm standby"), and once every replica is Ready SIGKILLs the leader.
It scrapes the standby's /metrics every 20 ms, the series it reads alone (`name[]`: not the
fleet's, a pass over the whole cache that, at 50 scrapes a second, held the new leader's loop
most of the time; a scrape is answered by the standby's own loop, so a loop held busy shows as a
later takeover), watches the leader key itself (`the leader key went <s> after the kill`: the
lease's part), and prints, last, `takeover: nodes=<n>
takeover_s=<the death to the standby's first reconcile> resync_s=<the death to its work
queues empty, for 0.5 s> lease_s=<lease> relists=<lists the standby made after the death>`.
Target: takeover_s at most the lease (--lease-seconds, 15 by default) plus 2 s. The leader's
lease outlives it by up to the lease (its last renewal was at most a renew interval before
the death); the standby campaigns when its watch on the leader key sees the key go.
Measured 2026-12-06 on the 2-core machine, shared (load 5-6 before the run), lease 15 s:
    --nodes 1000 --replicas 2200: all Ready after 15.7 s; the standby cost 2.2 CPU s from apply
      to all Ready (the leader 6.3); its informers listed each of their 7 kinds once, before
      the takeover, and not again; 9462 reconciles in its resync (every object once, then
      what they wrote)
      takeover: nodes=1000 takeover_s=15.43 resync_s=15.53 lease_s=15 relists=0
    the same with the replay beside the workers (this build), load 17: all Ready after 39.5 s; the
      standby led 16.46 s after the kill and reconciled at once; 14,209 reconciles in its resync
      takeover: nodes=1000 takeover_s=16.46 resync_s=18.26 lease_s=15 relists=0
    --nodes 10000 --replicas 22000, the same day, the machine at load 12-18 (other sessions' test
      runs; etcd's raw put rate 1700-2500/s against 5000-7400 on a quiet day), two runs:
      - the replay of the cache in one go before the workers started: all Ready after 238 s; the
        standby cost 20.8 CPU s from apply to all Ready (the leader 71.4); after the kill 88,055
        reconciles, relists 0, but its loop held by the replay (no scrape answered) until
        takeover: nodes=10000 takeover_s=23.76 resync_s=23.76 lease_s=15 relists=0
      - the replay beside the workers, 500 objects between their turns (this build): etcd timed
        out requests under the load and the leader stepped down three times during the run (the
        other took over each time; 2 relists after compactions); 21,988 of 22,000 Ready at the
        900 s timeout; the kill then: the standby led 33.4 s after it, and
        takeover: nodes=10000 takeover_s=33.35 resync_s=75.29 lease_s=15 relists=0
      Neither meets the target (lease + 2 s = 17 s) and neither says much of a quiet machine: with
      etcd's requests timing out, the leader key's expiry and the standby's campaign wait on etcd
      as the rest does. The 1,000-node runs above, at the same load, do meet it.
    On the same machine quiet (no other session's work), --nodes 10000 --replicas 22000, one run:
      binds/s=517 cm_cpu_ms_per_replica=4.61 cm_peak_rss_mb=472; the standby led 17.55 s after
      the kill, its first reconcile in the same scrape, 142,127 reconciles in its resync:
        takeover: nodes=10000 takeover_s=17.55 resync_s=26.03 lease_s=15 relists=0
      0.55 s past the target (17 s): the leader key's lease runs out at most 15 s after the kill,
      and the rest is etcd's expiry sweep and the campaign under a 10,000-node fleet's writes.
    Where the rest went (issue 43, branch takeover2, 2026-12-06 15:15-15:35 UTC, --nodes 2000
    --replicas 4400, the machine shared: load 9-17 on its 2 cores, each run's own figures
    swinging with it), the standby's log beside the bench's watch of the leader key:
      - three runs before: the key went 13.55, 13.55, 13.28 s after the kill; the standby led
        (as scraped) 18.43, 14.60, 18.57 s after it. In the third the standby won 5 ms after the
        key went, its first reconcile ended 1.9 s later, and a scrape waited 5.3 s for its loop
        (median 51 ms): every scrape made the new leader pass over its whole cache for the
        fleet's series, 50 times a second; its replay of the cache took 15.7 s.
      - and each standby watched the leader key anew every lease from the revision the leader
        took it at, so etcd sent each of those watches through the whole history since (every
        revision read and decoded under its watch lock) before reporting the key's deletion.
      Both fixed (the bench scrapes name[]; the standby watches from its read), one run:
        takeover: nodes=2000 takeover_s=15.93 resync_s=18.07 lease_s=15 relists=0
      the key went 15.04 s after the kill; the standby won 15 ms after that, its first
      reconcile ended 0.45 s later, the scrape that saw it waited 0.87 s for the loop (median
      2.3 ms); the replay took 3.0 s.
    --nodes 10000 --replicas 22000, this build (and the heartbeat watch's), load 7.5 falling to
      2.6 by the kill: all Ready after 151.5 s (336 binds/s under the load), the standby 25.0
      CPU s from apply to all Ready (the leader 79.1); the leader key went 15.32 s after the
      kill (its last renewal just before it), the standby's first reconcile seen 1.20 s later:
        takeover: nodes=10000 takeover_s=16.52 resync_s=22.17 lease_s=15 relists=0
      Within the target (17 s) by 0.48 s; what is left after the key goes is the campaign and
      the new term's first loop turns (the replay's first 500 objects, among them the
      scheduler's ledger built from the whole cache at its first use). A second run (load 3-6):
      the key gone at 13.45 s, takeover_s=14.66 resync_s=19.18: again 1.2 s after the key.
    + the replay tells of the heartbeats first (a live node's lifecycle reconcile reads the
      cache alone and writes nothing, so the term's first loop turns are short; the scheduler's
      ledger is built after them), one run, load 4-7: all Ready after 166.5 s; the key gone at
      13.20 s, the standby leading and its first reconcile seen 0.14 s after it:
        takeover: nodes=10000 takeover_s=13.34 resync_s=18.84 lease_s=15 relists=0
      At worst (the lease renewed just before the kill, etcd's 0.5 s expiry sweep) that is
      about 15.7 s: the target (17 s) with 1.3 s to spare.

Measured on the 2-core development machine (idle otherwise), 2026-12-02:
    full path (apply 24 models -> 2200 Ready, 1000 nodes):
      all Ready after 15.8 s; binds 412/s (2200 in 5.3 s; every replica created
      2.8 s after apply); apply-to-Ready p50 14.5 s, p99 15.7 s; etcd raw put
      rate 6039/s
      binds/s=412 ratio_to_raw_etcd=0.07
    the same build in later runs: 317-357 binds/s, all Ready in 18-20 s (the
    figures swing by a quarter from run to run on this machine).
    Tried and dropped: writing the placement and the Scheduled condition in one
    transaction (262-300 binds/s: a status write to a Pending replica then
    conflicts with the bind).
    earlier in the day, before batching: 120-160 binds/s, all Ready in 28-39 s.
Measured again 2026-12-03 (after group commit, the bind as the placement alone,
uvloop in every process), six runs on the same machine, idle otherwise, whose
etcd raw put rate was 2700-4000/s that day (6039 the day before):
      all Ready after 16.2-24.7 s; binds 203-364/s; apply-to-Ready p50 14.8-21.6 s;
      every replica created 2.6-3.7 s after apply; CPU seconds from apply to the
      end: etcd 7.5-9.9, hollow nodes + observer 6.2-8.0, controller-manager
      14.1-18.4 (the controller-manager 0.75-0.9 of a core the whole run)
      e.g. binds/s=265 ratio_to_raw_etcd=0.08
    The same build with asyncio's loop in place of uvloop: 305-364 binds/s,
    controller-manager 14.1-16.6 CPU s (no difference beyond the spread).
    A py-spy profile of the controller-manager: decoding watch events into
    objects (json + pydantic validation) ~11%, replica status patches ~14%,
    grpc.aio's calls and streams ~13%, the scheduler's reconcile 5%.
    Then objects decoded by pydantic's JSON validation in one pass (store:
    parse_stored, ~25 us a shard instead of ~44) and the scheduler's bind
    copying shallowly, three runs: all Ready after 13.6, 14.6, 16.3 s; binds
    320-366/s; controller-manager 11.7-13.5 CPU s, etcd 6.8-8.1, hollow nodes +
    observer 5.3-6.0; raw put rate 2600-4060/s.
    e.g. binds/s=366 ratio_to_raw_etcd=0.09
    Session 4 (same build, the machine busier: raw put rate 2600-3400/s), 4
    runs: all Ready 15.2-21.5 s, 246-356 binds/s. Tried, not kept: the
    scheduler in a process of its own (its own leader key; a throwaway
    script, not in the tree), three runs interleaved with three of the
    default: 303-397 binds/s against 246-269, all Ready 16.4-21.9 s against
    17.0-21.5 s, and 4.6-5.8 more CPU seconds in all (the scheduler's process
    decodes every replica event again). Binds come sooner, Ready does not:
    the two cores are already busy, so another process only moves CPU time
    around. It would also need a leader key per controller (two schedulers
    each with their own ledger would give out one GPU twice).
Session 5 (2026-12-03 afternoon; the machine's raw put rate 1900-4500/s, the
figures swing by a third from run to run, so changes were judged in
interleaved pairs against the build before them, three pairs or more each):
    - more workers where a reconcile mostly waits on etcd (scheduler 16 -> 64,
      replica 8 -> 32, model 2 -> 8): all Ready 13.3-19.6 s against
      18.2-21.7 (replica workers, 6 pairs, better in 5); every replica created
      1.3-1.6 s after apply against 2.7-5.4 (model workers); binds 457-466/s
      against 291-525 (scheduler workers).
    - controllers hear of each other's writes when the writer assumes them
      (Cache(on_assume=...)), not only when the lagging watch delivers them:
      3 pairs, 475-603 binds/s against 408-466, all Ready 14.0-16.0 s against
      16.3-18.2, and less CPU (controller-manager 12.7-13.7 s against 14.2-15.4).
    - gc looks at an owned object when it appears or its owner references
      change, not on every status event: 14.7k reconciles -> 4.6k per run.
    Tried and dropped: sparing the replica controller the watch echo of its
    own status writes (26% fewer replica reconciles, mean CPU 15.0 against 15.4 s:
    inside the spread, not worth the mechanism); TxnBatcher with 4 requests
    in flight (worse: 21-23 s, smaller batches cost more CPU) or 1 (no
    difference beyond the spread); hollow nodes with 128 workers (none); an
    observer reading raw documents instead of objects (none: the instrument
    was not what lagged).
    The build at the end of the session, 11 runs: binds 420-619/s (9 at 450
    or more, 5 at 500 or more), all Ready 12.5-21.3 s (median 16.4; within
    15 s in 2), apply-to-Ready p50 9.8-15.0 s (14.8-21.6 before), e.g.
      all Ready after 15.06s; binds: 2200 in 3.56s -> 619 binds/s; CPU etcd 6.8,
      hollow nodes + observer 4.2, controller-manager 13.7 (of 30.1 on 2 cores)
      binds/s=619 ratio_to_raw_etcd=0.14
Session 7 (2026-12-03 evening), each change in 4 pairs interleaved with the
build before it (A = the change, B = before; the machine's raw put rate
2600-4300/s):
    - patch_status(current=obj): a status patch of an object the caller holds
      is one compare-and-swap on its spec's and status's mod revisions and
      returns the caller's copy with the new status (no spec read, no object
      parsed again): all Ready 13.9-14.6 s against 14.0-16.5.
    - the fence's compare and read built once per term; the template hashed
      once per model reconcile: all Ready 12.3-16.6 s against 14.9-16.8
      (better in 3 of 4).
    - the controller-manager's collector (aio.keep_heap_out_of_gc): 1.3 s of
      its CPU in collections before, 0.44 s after (gc.callbacks); all Ready
      12.3-13.6 s against 12.3-14.2, CPU within the spread.
    - the informer's watchdog as one deadline per stream instead of wait_for
      per event: all Ready 10.4-12.4 s against 11.9-14.0, controller-manager
      9.1-10.1 CPU s against 11.0-12.3 (better in 4 of 4).
    - a status event decodes only the status (Store.watch reuses the object it
      last gave for that key): all Ready 9.9-13.3 s against 11.9-15.1,
      controller-manager 8.4-10.4 CPU s against 9.8-11.2 (better in 4 of 4).
    The build at the end of the session, 8 runs in a row: all Ready 10.6-13.8 s
    (all 8 within 15 s), binds 459-590/s (5 of 8 at 500 or more), apply-to-Ready
    p50 9.5-12.1 s; CPU from apply to the end: controller-manager 8.9-10.6,
    etcd 5.3-6.2, hollow nodes + observer 3.5-4.1 (of 21-28), e.g.
      all Ready after 11.54s; binds: 2200 in 3.73s -> 590 binds/s; p50 10.05s
      p99 11.42s; CPU etcd 5.7, hollow nodes + observer 3.9, controller-manager
      9.3 (of 23.1 on 2 cores)
      binds/s=590 ratio_to_raw_etcd=0.17
Targets: all Ready within 15 s is now met in every run of the session's last
build (12 of 12, 9.9-13.8 s); >= 500 binds/s in 7 of those 12 (459-624/s).
What limits binds: the scheduler binds as fast as the controller-manager's one
core lets it, while the same core creates the replicas (done 2.2-2.9 s after
apply), their shards and their status writes; the last binds (two-node
replicas, whose models are applied last) come 1.2-1.9 s after the last
replica is created. What limits the whole run is still CPU: the two cores are
busy from apply to the end. What got it here: the
model controller batches creates (32 at a time) and gathers replica events
for 0.1 s before reconciling a model; the store groups concurrent writes into
one etcd transaction and patches the status of an object its caller holds
with one compare-and-swap; workers sized for etcd's latency; controllers told
of a write by its writer; watch events decoded once and only as far as they
changed, with no task per event. Next: what the controller-manager spends per
replica (~4 ms of CPU: ~10 writes and ~15 decoded watch events; pydantic
decoding, grpc.aio's Python per call and the reconciles themselves, no single
hotspot left), and letting binds go ahead of shard creation when the core is
short.
Splitting the controllers over processes helps only where there are spare
cores (measured above).
Session 8 (2026-12-04), the same build as session 7's end, 8 runs in a row on
a machine about twice as fast as the day before (etcd's raw put rate
5100-7400/s; the gateway benchmark's engine cost 64-101 us per request against
224-270): all Ready 5.5-6.7 s, binds 873-1070/s (all 8 meet both targets),
every replica created 1.1-1.5 s after apply, apply-to-Ready p50 4.8-5.9 s; CPU
from apply to the end: controller-manager 4.5-5.6, etcd 3.2-3.9, hollow nodes +
observer 1.8-2.3 (of 11.0-13.4: both cores busy from apply to the end, so CPU
is still the limit), e.g.
      all Ready after: 5.51s (2200/2200 Ready)
      binds: 2200 in 2.06s -> 1070 binds/s; p50 4.84s p99 5.51s
      binds/s=1070 ratio_to_raw_etcd=0.15
On the slower machine of 2026-12-03 the same build met the Ready target in
12 of 12 runs and the binds target in 7 of 12 (above).
One reflector and jittered backoffs (informers, client watches, gateway and watch
cache through llmgw/reflector.py; llmgw/backoff.py), 2026-12-04, --nodes 300
--replicas 600, interleaved with main's build (A B A B):
    machine loaded by other work (load 2.2-3.2), 2 pairs: this build all Ready after
      1.85, 2.24 s, binds 695, 774/s; main 2.28, 1.44 s, 898, 1003/s
    machine quiet, 5 pairs: this build all Ready after 1.28-1.37 s, binds
      1183-1325/s, controller-manager 1.0-1.1 CPU s; main 1.22-1.44 s,
      1146-1380/s, 1.0 CPU s (no difference beyond the spread)
Leadership terms as controller.start(ctx), the store's lister-watchers beside it, names as
a write hook (issue 29), 2026-12-05, hack/bench/interleave.py against main (ABBA, one round,
load 0.5-1.3): --nodes 200 --replicas 440 binds/s main 704, 1110, this build 1127, 659
(medians 907 / 893); --nodes 1000 --replicas 2200 main 1062, 854, this build 1059, 1064
(medians 958 / 1062): no difference beyond the spread.

At scale (issue 34), 2026-12-05, --nodes 10000 --replicas 22000 --profile FILE (py-spy
record --rate 50 on the controller-manager, collapsed stacks), one run each on the 2-core
machine (helpers' work began during the later runs: load 2-5):
    before: all Ready after 112.8 s, binds 540/s, controller-manager 91.0 CPU s (4.1 ms per
      replica), etcd 38.2, hollow nodes + observer 23.0; 16,000 "event queue full" log lines.
      Profile: the model controller 49% of the controller-manager's samples (plan() and its
      list comprehensions 31%, is_ready 7%, the cache's index list 5%): every reconcile of a
      model read all of its ~900 replicas' pydantic objects, at up to 10 reconciles a second.
    a plan reads each replica's facts once per object (a memo per model; 900 replicas 1.86 ->
      0.45 ms a plan): all Ready 98.2 s, controller-manager 64.7 CPU s.
    + replica events gather 0.1 s per 200 replicas of the model (Controller.batch_delay), drops
      of the event recorder logged once per 10 s: all Ready 74.6 s, binds 618/s, 51.8 CPU s.
    + the echo of the model controller's own status write reconciles nothing (a predicate):
      all Ready 90.0 s on the busier machine, binds 532/s, 51.5 CPU s; facts_of 7.5 -> 4.8% of
      the samples. Last line:
      binds/s=532 ratio_to_raw_etcd=0.15 cm_cpu_ms_per_replica=2.34 cm_peak_rss_mb=866 writes_per_replica=12.6
    the same build at --nodes 1000 --replicas 2200:
      binds/s=1067 ratio_to_raw_etcd=0.16 cm_cpu_ms_per_replica=1.95 cm_peak_rss_mb=158 writes_per_replica=13.4
    + one ReplicaCreated event per create batch instead of one per replica, on a quiet machine
      (load 0.7; etcd's raw put rate 5569/s): all Ready 59.5 s, binds 806/s, controller-manager
      49.7 CPU s, etcd 32.3, hollow nodes + observer 21.0 (of 119 on 2 cores):
      binds/s=806 ratio_to_raw_etcd=0.14 cm_cpu_ms_per_replica=2.26 cm_peak_rss_mb=869 writes_per_replica=12.4
    Where the memory goes (tracemalloc, --in-process at 1,000 nodes, so the hollow nodes' share is
    in it too: 155 MB traced): objects decoded by pydantic 99 MB (type_adapter 61, main 38: a
    Replica is ~7.7 KB as an object, 1.2 KB as JSON), aetcd's KeyValues 13 MB and the store's
    watches' raw spec and status bytes (Objects.watch keeps each key's last spec kv and status
    value beside the object it yielded, to assemble the next event), copies 8 MB. So the 500 MB
    target at 10,000 nodes needs a more compact object (or sharing equal parts between objects),
    not a fix in one place.
    So the controller-manager's CPU per replica at 10,000 nodes is 1.2 times its 1,000-node
    figure (2.2 before; target 1.3). Still short of the targets: binds 532-618/s (1,000), all
    Ready 75-90 s (60), peak RSS 866 MB (500: a Replica is ~7.7 KB as a pydantic object against
    1.2 KB of JSON). Where the rest goes now (profile): the replica controller 19% (its status
    writes 6%), the informers 16% (decoding watch events), the scheduler 10%, the model
    controller 9% (of which creating replicas 6.5%). Writes per replica (a raw watch, 1,000
    nodes): shard status 3.3 (the agents), replica status 3.0, replica events 3.0, replica
    spec 2.0 (create, bind), shard spec 1.1, model events 1.0 (ReplicaCreated), model status 0.07.
Memory (issue 34), 2026-12-05, the same way (--nodes 10000 --replicas 22000, one run each). The
machine is shared with other sessions from here on, so wall times (all Ready, binds/s) swing with
their load: judge a change by the controller-manager's peak RSS (deterministic within a few MB)
and its CPU seconds per replica, not by the times. Ranked first at --nodes 2000 --replicas 4400
with tracemalloc in the controller-manager (204 MB traced after all Ready): objects decoded by
pydantic 111 MB (Nodes 39 of it: ~19.5 KB each as objects, 2 KB as JSON), imports 18, aetcd's
KeyValues 13 (the watches' and Documents' raw bytes), copies of fields sets and dicts in
model_copy 8, the scheduler's ledger 5.5.
    every pydantic model carries its own "fields set" (~730 bytes for five fields or more; a
    Node holds ~20 models): decoded objects share one set per shape (llmgw/api/compact.py; a Node
    19.5 -> 8.8 KB): peak RSS 869 -> 577 MB, CPU per replica 2.26 -> 2.29 ms (same), all Ready
    71.4 s, binds 710/s (load 1-2):
      binds/s=710 ratio_to_raw_etcd=0.13 cm_cpu_ms_per_replica=2.29 cm_peak_rss_mb=577 writes_per_replica=12.4

Issue 34's scale, measured as the issue measured it (one run per size, 2.2 replicas per node,
one in eleven two-node, the controller-manager watched from apply to all Ready). Filed with:

    | nodes / replicas | all Ready | binds/s | controller-manager CPU per replica | controller-manager peak RSS |
    |---|---|---|---|---|
    | 1,000 / 2,200 | 7.1 s | 790 | 2.6 ms | 150 MB |
    | 2,000 / 4,400 | 12.6 s | 956 | 2.3 ms | 229 MB |
    | 4,000 / 8,800 | 31.4 s | 879 | 3.1 ms | 384 MB |
    | 10,000 / 22,000 | 147 s | 512 | 6.3 ms | 985 MB |

Session 14 (2026-12-05, 16:40-18:10 UTC, the machine quiet: load under 1 before each run, etcd's raw
put rate 5000-7100/s). At its start, the build above, three runs at 10,000 nodes: all Ready
64.0-66.0 s, binds 763-830/s, 2.29-2.51 ms per replica, 574-580 MB, 12.4 writes per replica;
CPU from apply to the end: controller-manager 50.4-55.3 s, etcd 33.8-38.1, hollow nodes +
observer 19.6-22.3. Each step, one run at 10,000 nodes unless said:
    - no raw documents beside decoded objects: a watch kept each key's last spec KeyValue and
      status bytes, and every Store a bounded copy of the last documents it saw (to write
      without reading); now an object carries the mod revisions of its two keys and writes
      compare-and-swap on the caller's copy (update(obj, current=), patch_status(current=));
      and a create with the default status writes no status key (two writes less per
      replica: the replica's and its shard's): all Ready 53.4 s, binds 917/s, 2.10 ms,
      479 MB, writes 12.4 -> 10.3, etcd 26.1 CPU s.
    - a watcher's own writes come back as the copies its cache holds (watch(held=)): an
      update's or status patch's result is what the store holds at that revision, so its
      echo is not decoded again (creates still are: the held copy is the writer's input);
      those results share their fields sets (they now stay in caches): 48.2 s, 1076/s,
      1.92 ms, 485 MB.
    - cache.heartbeats() the live set (node lifecycle copied all 10,000 per reconcile); a
      status patch validates the patch alone and merges it as models; the event recorder's
      dedup keeps hashes within its window; decoded Nodes share their engines, adapters and
      port range (8.5 -> 6.8 KB a Node, llmgw/api/compact.py); the observer reads documents
      and the hollow nodes' watch reuses the shards they wrote (instrument and harness
      17.2 -> 13.3-14.4 CPU s): two runs, 51.4 and 48.1 s, 974 and 1022 binds/s, 2.07 and
      2.01 ms, 452 and 463 MB.
    - the scheduler's workers 64 -> 256: a bind is latency-bound, waiting its turn in the
      process's write batches behind every other controller's writes. Interleaved with the
      build before it (hack/bench/interleave.py, ABBA): binds/s median 977 -> 1580 (1.62),
      CPU per replica 2.04 -> 1.71 ms (binds no longer trail creation, so fewer replica
      reconciles and status writes in between), 457 -> 437 MB, writes 10.3 -> 10.0.
    - a Node event wakes the waiting (unschedulable) replicas only when it changes what
      placement sees (not in this benchmark, whose nodes do not change; a fleet's nodes
      write their status all the time, and each wake retried every waiting replica).
The build at the session's end, one run per size (two more at 10,000 nodes, one with --profile):

    | nodes / replicas | all Ready | binds/s | controller-manager CPU per replica | controller-manager peak RSS |
    |---|---|---|---|---|
    | 1,000 / 2,200 | 4.3 s | 1514 | 1.71 ms | 114 MB |
    | 2,000 / 4,400 | 8.0 s | 1783 | 1.64 ms | 154 MB |
    | 4,000 / 8,800 | 17.7 s | 1509 | 1.76 ms | 226 MB |
    | 10,000 / 22,000 | 44.3-45.3 s | 1447-1529 | 1.74-1.80 ms | 436-442 MB |

      binds/s=1482 ratio_to_raw_etcd=0.22 cm_cpu_ms_per_replica=1.76 cm_peak_rss_mb=436 writes_per_replica=10.0
    (1,000 nodes, the same build, with --profile: 4.3 s, 1698 binds/s, 1.60 ms, 115 MB.)
So at 10,000 nodes against the targets: CPU per replica 1.74-1.80 ms, 1.02-1.1 times the
1,000-node figure (1.60-1.71; target at most 1.3); peak RSS 436-442 MB (500); 1447-1529
binds/s (1000); all Ready 44.3-45.3 s (60); writes per replica 10.0 (12.4 before). Every
replica is created 14.8-15.2 s after apply and bound as it is created; apply-to-Ready p50
39.7-40.5 s: the pipeline after the bind (shards, agents, status) is what the rest of the run
waits on, with both cores busy to the end (controller-manager 38.7-39.5 CPU s, etcd 21.6-21.9,
hollow nodes + observer 12.5-12.7, of 89-90.5).
Profiles (py-spy, the share of the controller-manager's samples), 1,000 / 10,000 nodes: replica
controller 22 / 20%, informers (decoding watch events, the cache, handlers) 16 / 14%, scheduler
9 / 8%, model controller 4 / 5%, gRPC's poller thread 4 / 5%, write batcher 4 / 3%, event
recorder 2 / 3%; the rest (gRPC and aetcd's watch streams ~13%, unary calls, the loop) alike
at both sizes. No reconcile or event costs more at 10,000 nodes than at 1,000.
Where the memory is now (per decoded object, tracemalloc): a Node 6.8 KB (2 KB as JSON), a
Replica 4.1 KB (1.2), a Shard 3.3 KB (1.0): ~240 MB of the 440 at 10,000 nodes; the rest is
the process itself (~80 MB), the scheduler's ledger and the controllers' indexes. What is left:
a decoded object is still 3-4 times its JSON (pydantic's per-instance dicts).
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from controllers.settings import ControllerSettings
from llmgw import aio
from llmgw.api import Model, Replica, Shard
from llmgw.cmd.controller_manager import controllers
from llmgw.dev.etcd import etcd_cluster
from llmgw.dev.process import free_port, terminate
from llmgw.hollow import FakeAgents
from llmgw.runtime.manager import Manager
from llmgw.store import Store, keys

FABRICS = ("fab-a", "fab-b", "fab-c", "fab-d")


async def raw_put_rate(store: Store, n: int = 3000, concurrency: int = 64) -> float:
    value = b'{"bench":"' + b"x" * 200 + b'"}'
    sem = asyncio.Semaphore(concurrency)

    async def one(i: int) -> None:
        async with sem:
            await store.kv.put(f"/bench/raw/{i}", value)

    t0 = time.perf_counter()
    await asyncio.gather(*(one(i) for i in range(n)))
    return n / (time.perf_counter() - t0)


def models(total: int) -> list[Model]:
    wide = total // 11
    single = total - wide
    out = []
    for count, prefix, n_models, nodes, gpus in ((single, "m", 20, 1, 2), (wide, "w", 4, 2, 8)):
        for i in range(n_models):
            replicas = count // n_models + (1 if i < count % n_models else 0)
            out.append(Model.model_validate({"metadata": {"name": f"{prefix}{i:02d}"}, "spec": {
                "replicas": replicas,
                "profiles": [{"engine": "sim", "nodes": nodes, "gpusPerNode": gpus}]}}))
    return out


class Observer:
    """Watches replicas' keys on its own connection: bind and Ready times by name.

    It reads the stored JSON documents, not objects: at 10,000 nodes the machine is busy
    from apply to the end, and decoding every replica event into an object (as the
    controllers do) cost the instrument ~3 CPU seconds of the two cores it measures on.
    """

    def __init__(self, store: Store, rev: int):
        self.created: dict[str, float] = {}
        self.bound: dict[str, float] = {}
        self.ready: dict[str, float] = {}
        self.done = asyncio.Event()
        self.want = 0
        self.want_bound = 0      # --scheduler-only: done when this many are bound
        self.tasks = [asyncio.create_task(self._specs(store, rev)), asyncio.create_task(self._statuses(store, rev))]

    async def _specs(self, store: Store, rev: int) -> None:
        prefix = keys.kind_prefix(keys.SPEC, Replica.kind_plural)
        async for ev in store.kv.watch(prefix, rev + 1):
            t, name = time.perf_counter(), ev.key[len(prefix):]
            if ev.type == "DELETE":
                continue
            self.created.setdefault(name, t)
            if name not in self.bound and json.loads(ev.value)["spec"]["placement"]:
                self.bound[name] = t
                if self.want_bound and len(self.bound) >= self.want_bound:
                    self.done.set()

    async def _statuses(self, store: Store, rev: int) -> None:
        prefix = keys.kind_prefix(keys.STATUS, Replica.kind_plural)
        async for ev in store.kv.watch(prefix, rev + 1):
            t, name = time.perf_counter(), ev.key[len(prefix):]
            if ev.type == "DELETE" or name in self.ready:
                continue
            if json.loads(ev.value)["phase"] == "Ready":
                self.ready[name] = t
                if self.want and len(self.ready) >= self.want:
                    self.done.set()

    def cancel(self) -> None:
        for task in self.tasks:
            task.cancel()


async def write_backlog(store: Store, todo: list[Model]) -> None:
    from controllers.model import replica_name
    from llmgw.api import ObjectMeta, OwnerReference, ReplicaSpec, template_hash
    from llmgw.api.wellknown import MODEL_LABEL, SHARDS_FINALIZER

    sem = asyncio.Semaphore(64)

    async def one(m: Model, thash: str) -> None:
        r = Replica(
            metadata=ObjectMeta(name=replica_name(m.name, thash), labels={MODEL_LABEL: m.name},
                                finalizers=[SHARDS_FINALIZER],
                                ownerReferences=[OwnerReference(kind="Model", name=m.name, uid=m.metadata.uid)]),
            spec=ReplicaSpec(model=m.name, templateHash=thash, profile=m.spec.profiles[0],
                             servedModelNames=m.served_names))
        async with sem:
            await store.create(r)

    for i, m in enumerate(todo):
        todo[i] = m = await store.create(m)
        thash = template_hash(m.spec)
        await asyncio.gather(*(one(m, thash) for _ in range(m.spec.replicas)))


def pct(values: list[float], p: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(p / 100 * len(values)))] if values else float("nan")


def peak_rss_mb(pid: int) -> float:
    """The process's peak resident memory so far (VmHWM), in MB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return 0.0


async def etcd_writes(endpoint: str) -> float:
    """Keys etcd has put and deleted so far (its etcd_mvcc_put_total + etcd_mvcc_delete_total),
    read from its /metrics: a transaction of many writes counts each."""
    async with aiohttp.ClientSession() as http, http.get(endpoint.rstrip("/") + "/metrics") as resp:
        text = await resp.text()
    return sum(float(line.split()[-1]) for line in text.splitlines()
               if line.startswith(("etcd_mvcc_put_total ", "etcd_mvcc_delete_total ")))


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process so far (from /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def main(args) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        etcd = etcd_cluster(Path(tmp), size=1).start()
        try:
            await bench(etcd.endpoint, etcd.members[0].proc.pid, args)
        finally:
            etcd.stop()


async def bench(endpoint: str, etcd_pid: int, args) -> None:
    store, observer_store = Store(endpoint), Store(endpoint)
    await store.connect()
    await observer_store.connect()
    # one put per request, as etcd sees a client that does not batch
    unbatched = await Store(endpoint, batch_writes=False).connect()
    raw = await raw_put_rate(unbatched)
    await unbatched.close()
    print(f"etcd raw put rate: {raw:.0f} puts/s", flush=True)

    agents = await FakeAgents(store, [], workers=32, heartbeat_ttl=60).start()
    names = [f"node-{i:04d}" for i in range(args.nodes)]
    t0 = time.perf_counter()
    for i in range(0, len(names), 64):
        await asyncio.gather(*(agents.add_node(n, gpus=8, fabric=FABRICS[j % len(FABRICS)])
                               for j, n in enumerate(names[i:i + 64], start=i)))
    print(f"registered {len(names)} hollow nodes in {time.perf_counter() - t0:.1f}s", flush=True)

    todo = models(args.replicas)
    settings = ControllerSettings(compact_interval=3600.0)
    chosen = [c for c in controllers(settings) if c.name == "scheduler" or not args.scheduler_only]
    manager = proc = None
    managers: dict[str, tuple[subprocess.Popen[bytes], str]] = {}   # identity -> (process, metrics URL)
    if args.in_process or args.backlog:
        manager = Manager(store, chosen, identity="bench", settings=settings)
    else:
        # the real `llmgw controller-manager`, in its own process (its own core); with --takeover
        # a second one beside it, its warm standby
        for identity in ("cm-0", "cm-1")[:2 if args.takeover else 1]:
            port = free_port()
            managers[identity] = (subprocess.Popen(
                [sys.executable, "-m", "llmgw.cli.main", "controller-manager", "--etcd", endpoint,
                 "--identity", identity, "--lease-seconds", str(args.lease_seconds),
                 "--metrics-listen", f"127.0.0.1:{port}", "--log-level", "warning"]), f"http://127.0.0.1:{port}/metrics")
        while (leader := await store.election.leader("controller-manager")) is None:
            await asyncio.sleep(0.1)
        proc = managers[leader["holder"]][0]
    if args.backlog:
        # The model controller's output written beforehand: the run starts with
        # every replica Pending, so binds are not paced by replica creation.
        await write_backlog(store, todo)
    elif proc is None:
        mtask = asyncio.create_task(manager.run())
        await asyncio.wait_for(manager.leading.wait(), 120)
    _, rev = await store.list(Replica)
    observer = Observer(observer_store, rev)
    observer.want = sum(m.spec.replicas for m in todo)
    if args.scheduler_only:
        observer.want_bound = observer.want

    pids = {"etcd": etcd_pid, "hollow nodes + observer": os.getpid()}
    if proc is not None:
        pids["controller-manager"] = proc.pid
        for p, _ in managers.values():
            if p is not proc:
                pids["standby controller-manager"] = p.pid
    cpu_before = {name: cpu_seconds(pid) for name, pid in pids.items()}
    writes_before = await etcd_writes(endpoint)
    spy = None
    if args.profile and proc is not None:
        # py-spy (pip install py-spy) samples the controller-manager from apply to the end;
        # --format raw is the collapsed-stack text that flame graph tools read
        spy = subprocess.Popen(["py-spy", "record", "--pid", str(proc.pid), "--rate", "50", "--nonblocking",
                                "--format", "raw", "--output", args.profile], stdout=subprocess.DEVNULL)
    t_apply = time.perf_counter()
    if args.backlog:
        mtask = asyncio.create_task(manager.run())
    else:
        await asyncio.gather(*(store.create(m) for m in todo))
    try:
        await asyncio.wait_for(observer.done.wait(), args.timeout)
    except asyncio.TimeoutError:
        print(f"timed out: {len(observer.bound)} bound, {len(observer.ready)} Ready of {observer.want}")
        for r in (await store.list(Replica))[0]:
            if r.status.phase != "Ready":
                shards = [s for s in (await store.list(Shard))[0] if s.spec.replica == r.name]
                print(f"  not Ready: {r.name} phase={r.status.phase} placement={r.spec.placement} "
                      f"deleting={r.metadata.deletionTimestamp} message={r.status.message!r} "
                      f"shards={[(s.name, s.status.phase, s.metadata.deletionTimestamp) for s in shards]}")
    t_end = time.perf_counter()
    cpu = {name: cpu_seconds(pid) - cpu_before[name] for name, pid in pids.items()}
    writes = await etcd_writes(endpoint) - writes_before
    rss = peak_rss_mb(proc.pid) if proc is not None else peak_rss_mb(os.getpid())
    if spy is not None:
        spy.send_signal(signal.SIGINT)
        spy.wait(60)

    bound = sorted(observer.bound.values())
    binds_per_s = len(bound) / (bound[-1] - t_apply) if bound else 0.0
    to_ready = [t - t_apply for t in observer.ready.values()]
    print(f"replicas: {observer.want} ({len(todo)} models) on {args.nodes} nodes x 8 GPUs, {len(FABRICS)} fabrics")
    print(f"all Ready after: {t_end - t_apply:.2f}s ({len(observer.ready)}/{observer.want} Ready)")
    if bound:
        steady = (len(bound) - 1) / (bound[-1] - bound[0]) if len(bound) > 1 else 0.0
        print(f"first bind {bound[0] - t_apply:.2f}s after apply; first to last bind: {steady:.0f} binds/s")
    print(f"binds: {len(bound)} in {bound[-1] - t_apply if bound else 0:.2f}s -> {binds_per_s:.0f} binds/s")
    created = sorted(observer.created.values())
    print(f"created: {len(created)} replicas, the last {created[-1] - t_apply:.2f}s after apply")
    print(f"apply-to-Ready: p50 {pct(to_ready, 50):.2f}s p99 {pct(to_ready, 99):.2f}s")
    print("CPU seconds from apply to the end: " + ", ".join(
        f"{name} {sec:.1f}" for name, sec in cpu.items()) + f" (of {2 * (t_end - t_apply):.1f} on 2 cores)")
    print(f"etcd raw put rate: {raw:.0f} puts/s")
    cm_cpu = cpu.get("controller-manager", cpu["hollow nodes + observer"])
    print(f"binds/s={binds_per_s:.0f} ratio_to_raw_etcd={binds_per_s / raw:.2f} "
          f"cm_cpu_ms_per_replica={cm_cpu * 1000 / observer.want:.2f} cm_peak_rss_mb={rss:.0f} "
          f"writes_per_replica={writes / observer.want:.1f}")

    if managers:
        if args.takeover:
            await takeover(store, managers, args)
        for p, _ in managers.values():
            terminate(p, 30)
    else:
        await manager.stop()
        mtask.cancel()
    await agents.stop()
    observer.cancel()


# what the takeover reads: only these, so a scrape every 20 ms is not a pass over the fleet
# (the leader's fleet series) on the loop it measures
SCRAPED = ("llmgw_controller_reconcile_duration_seconds_count", "llmgw_controller_queue_depth",
           "llmgw_informer_lists_total", "llmgw_controller_manager_leader")


async def scrape(http: aiohttp.ClientSession, url: str) -> dict[str, float]:
    """A controller-manager's /metrics, as the sums the takeover reads: reconciles, the keys in
    its work queues, and its informers' lists."""
    async with http.get(url, params=[("name[]", name) for name in SCRAPED]) as resp:
        text = await resp.text()
    sums = {"reconciles": 0.0, "depth": 0.0, "lists": 0.0, "leader": 0.0}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "llmgw_controller_reconcile_duration_seconds_count":
                sums["reconciles"] += sample.value
            elif sample.name == "llmgw_controller_queue_depth":
                sums["depth"] += sample.value
            elif sample.name == "llmgw_informer_lists_total":
                sums["lists"] += sample.value
            elif sample.name == "llmgw_controller_manager_leader":
                sums["leader"] = sample.value
    return sums


async def takeover(store: Store, managers: dict[str, tuple[subprocess.Popen[bytes], str]], args) -> None:
    """Kill the leading controller-manager (SIGKILL: its lease is left to expire) and time its
    standby: from the death to its first reconcile (takeover_s), and to its work queues empty
    again (resync_s: the first of 0.5 s of scrapes, every 20 ms, that all find no key waiting)."""
    leader = await store.election.leader("controller-manager")
    assert leader is not None
    standby = next(url for identity, (_, url) in managers.items() if identity != leader["holder"])
    key = keys.leader_key("controller-manager")
    read = await store.etcd.range(key)
    gone = asyncio.get_running_loop().create_future()

    async def watch_key() -> None:   # when etcd let the dead leader's key go, as a watch of our own hears it
        async for ev in store.kv.watch(key, read.header.revision + 1):
            if ev.type == "DELETE":
                gone.set_result(time.perf_counter())
                return

    watcher = asyncio.create_task(watch_key())
    async with aiohttp.ClientSession() as http:
        before = await scrape(http, standby)
        managers[leader["holder"]][0].kill()
        t_death = time.perf_counter()
        won = first = empty_since = None
        while True:
            now = await scrape(http, standby)
            t = time.perf_counter()
            if won is None and now["leader"]:
                won = t
            if first is None and now["reconciles"] > before["reconciles"]:
                first = t
            if first is not None:
                empty_since = (empty_since or t) if now["depth"] == 0 else None
                if empty_since is not None and t - empty_since >= 0.5:
                    break
            if t - t_death > args.timeout:
                print(f"takeover timed out: reconciles {now['reconciles']:.0f}, depth {now['depth']:.0f}")
                watcher.cancel()
                return
            await asyncio.sleep(0.02)
    watcher.cancel()
    assert won is not None and first is not None and empty_since is not None
    if gone.done():
        print(f"takeover: the leader key went {gone.result() - t_death:.2f}s after the kill")
    print(f"takeover: {leader['holder']} killed; its standby led {won - t_death:.2f}s after (as its metrics "
          f"first said); its informers listed {before['lists']:.0f} times before and {now['lists']:.0f} after; "
          f"{now['reconciles']:.0f} reconciles by the end of its resync")
    print(f"takeover: nodes={args.nodes} takeover_s={first - t_death:.2f} resync_s={empty_since - t_death:.2f} "
          f"lease_s={args.lease_seconds} relists={now['lists'] - before['lists']:.0f}")


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--nodes", type=int, default=1000)
    ap.add_argument("--replicas", type=int, default=2200)
    ap.add_argument("--timeout", type=float, default=180.0)
    ap.add_argument("--scheduler-only", action="store_true",
                    help="run only the scheduler (implies --backlog): its own bind rate; nothing gets Ready")
    ap.add_argument("--in-process", action="store_true",
                    help="run the controllers in this process instead of `llmgw controller-manager`")
    ap.add_argument("--profile", metavar="FILE",
                    help="sample the controller-manager with py-spy from apply to the end into FILE "
                         "(collapsed stacks)")
    ap.add_argument("--backlog", action="store_true",
                    help="write the models' replicas before starting the controllers (binds not paced "
                         "by the model controller); times are from the manager's start")
    ap.add_argument("--takeover", action="store_true",
                    help="run a second controller-manager, its warm standby; once all are Ready kill the leader "
                         "and print the standby's takeover (last line `takeover: ...`)")
    ap.add_argument("--lease-seconds", type=int, default=15, help="the controller-managers' leader lease")
    args = ap.parse_args()
    args.backlog = args.backlog or args.scheduler_only
    aio.run(main(args))

#!/usr/bin/env python3
"""LoRA adapters under skewed traffic: how often a request finds its adapter loaded, what a cold
one costs, and how long an engine's adapters take to come back after it is killed.

    .venv/bin/python hack/bench/adapters.py [--adapters 1000] [--replicas 8] [--slots 8]
        [--load-seconds 0.5] [--requests 3000] [--concurrency 32] [--zipf 1.1] [--seed 1]

A local cluster (`llmgw dev up`'s: etcd, server, controller-manager, gateway, an agent on 8 fake
GPUs, every one a process) serves one sim base model of --replicas replicas with --slots adapter
slots each (spec.adapters.maxLoaded; the sim takes --load-seconds per load) and --adapters
Adapters at minReplicas 0: each is loaded where a request for it lands (the gateway's demand), and
evicts the least recently requested where no slot is free. --requests short streamed completions,
each for an adapter drawn from Zipf(--zipf) over the adapters (rank 1 the most requested), are
sent by --concurrency clients back to back. Then the engine of the replica holding the most
adapters is killed, and the time until every adapter resident on it is resident on it again is
measured (the agent loads them before its rebuilt replica is Ready). It prints each component's
CPU seconds during the traffic (etcd, server, controller-manager, gateway, agent: the sims, its
children, not counted), where the requests' losses go (below), and

    adapters: hit_ratio=<requests served where the adapter was already resident>
        burst_hit_ratio=<the same, a request sent while one before it for the same adapter
            still waited (it joined a load in flight) not counted a miss: one miss per burst, as the
            oracle counts it>
        oracle_hit_ratio=<the same draws through one LRU of replicas x slots entries>
        slru_oracle_hit_ratio=<through one segmented LRU of as many (80 % protected): the
            gateway's victims' policy>
        cold_ttft_p50_s=<> cold_ttft_p99_s=<median and p99 time to first token of the requests
        that were not hits> restore_s=<>
        cpu_s=<CPU seconds of the components during the traffic> controller_cpu_s=<the controller-manager's>

A request is a hit when its first token comes within half the load time (a request that waits for
a load waits at least the load time; a hit's answer is a few milliseconds). The oracle is the
best any placement of the same slots could do with LRU: one cache over all of them, no replica
boundaries, no loads in flight. Before it, the losses: cold requests that joined a load in flight,
cold ones the oracle would have hit with none waiting before them (the adapter evicted earlier
than LRU would, or a hit slower than the cut), and each eviction's victim against LRU's (the
seconds since its last request against those since the last request of the adapter LRU would
evict then). Targets (issue 47): hit_ratio at least 0.95 of oracle_hit_ratio,
cold_ttft_p99_s at most the load time plus 0.5 s, restore_s at most 10 s.

On the 2-core development machine (shared with six other sessions' work), 2026-12-06:
    before (main at a586b7f): earlier that day, and again beside the runs below (load average 10):
        3000 requests in 134.8 s, 1779 cold, 526 adapters requested
        adapters: hit_ratio=0.407 oracle_hit_ratio=0.597 cold_ttft_p99_s=4.66 restore_s=4.16
        3000 requests in 200.2 s, 1800 cold, 526 adapters requested
        adapters: hit_ratio=0.400 oracle_hit_ratio=0.597 cold_ttft_p99_s=7.83 restore_s=8.82
    after (event-driven unloads and residency, the controller's placement read from indexes,
    agents woken only for the replicas an Adapter change concerns), load average 8 to 13:
        3000 requests in 97.2 s, 1688 cold, 526 adapters requested
        adapters: hit_ratio=0.437 oracle_hit_ratio=0.597 cold_ttft_p99_s=6.01 restore_s=6.74
        3000 requests in 107.7 s, 1759 cold, 526 adapters requested
        adapters: hit_ratio=0.414 oracle_hit_ratio=0.597 cold_ttft_p99_s=5.06 restore_s=3.98
    --adapters 200 --requests 600: hit_ratio=0.555 oracle_hit_ratio=0.727 cold_ttft_p99_s=3.24 restore_s=6.15
Against the targets: restore_s is met; hit_ratio (0.69-0.73 of the oracle's) and cold_ttft_p99_s
(10 to 12 times the load time) are not. Where a cold request's time goes, medians of the 1000-adapter
runs from the cluster's logs (the first token's time less the controller's Loading event, the
agent's load and the Resident event): the gateway's demand report to the controller's placement
0.22-0.31 s, placement to loaded 1.05 s (the 0.5 s load, the agent's sync behind the one before it
on the same engine: an engine loads about one adapter a second here), loaded to Resident (the
shard's report, the controller) 0.27-0.32 s, Resident to the first token 0.18-0.21 s. The loads
are about the oracle's misses (1317 to its 1209 in one run): what the hit ratio loses is the requests
that wait on a load in progress (the oracle counts one miss per burst) and hits slower than half
the load time on a machine at load 10; both shrink with the cold path. Left: a gateway that loads
into a replica's free slot itself (the controller's two writes and a shard report off the path),
and loads that do not wait for the engine's previous sync.

Tried and not taken (branch adapters3, 4130b38): loads beside the syncs (an engine's loads
started at once, up to its free slots, each reported as it lands), later that day on a quieter
machine, alternating with main at 6baa73e (its agent and controllers from PYTHONPATH, this
bench), in the order run, load average 3 to 9 ("before" is main, as it stays):
    after   hit_ratio=0.431 cold_ttft_p99_s=2.27 restore_s=3.35   (72.2 s)
    before  hit_ratio=0.425 cold_ttft_p99_s=1.74 restore_s=2.21   (58.0 s)
    after   hit_ratio=0.451 cold_ttft_p99_s=2.01 restore_s=2.51   (64.0 s)
    before  hit_ratio=0.434 cold_ttft_p99_s=2.22 restore_s=2.65   (67.0 s)
    after   hit_ratio=0.437 cold_ttft_p50_s=1.26 cold_ttft_p99_s=2.02 restore_s=2.49   (66.4 s)
    before  hit_ratio=0.416 cold_ttft_p50_s=0.99 cold_ttft_p99_s=1.61 restore_s=2.18   (54.8 s)
    after   hit_ratio=0.435 cold_ttft_p50_s=1.21 cold_ttft_p99_s=1.89 restore_s=2.50   (64.5 s)
    before  hit_ratio=0.418 cold_ttft_p50_s=1.10 cold_ttft_p99_s=1.81 restore_s=2.55   (61.5 s)
    after   hit_ratio=0.428 cold_ttft_p50_s=1.29 cold_ttft_p99_s=2.33 restore_s=2.59
            CPU seconds of the run: controller 29, etcd 28, server 26, agent 18, gateway 14
    before  hit_ratio=0.435 cold_ttft_p50_s=1.17 cold_ttft_p99_s=2.16 restore_s=2.44
            CPU seconds of the run: controller 29, etcd 28, server 25, agent 14, gateway 15
(oracle_hit_ratio=0.597 throughout.) The hit ratio gains up to 0.02 in three pairs of four, but a
cold request is slower, not faster: p50 1.21-1.29 s against 0.99-1.17, p99 1.89-2.33 against
1.61-2.22. The controller and the server spend no more CPU (the last pair): the agent does (18 s
against 14), where each landed load is now a sync of its own (the runner woken, a probe and two
listings of the engine, a shard status write) after the load's answer, where a sync listed its
batch once at once; a load landing during another sync waits for it. Next to try: report a
landed load from the listing alone, ordered with the syncs so that no older listing overwrites a
newer one. The machine state moves the figures far more than either change: main gave
cold_ttft_p99_s 4.66-7.83 at load 10 above and 1.61-2.22 here (target: the 0.5 s load time
+ 0.5 s), its hit ratio 0.416-0.435, 0.70-0.73 of the oracle's (target 0.95). Targets not met.

Where the hits go (issue 47, adapters4: this bench's losses, main at a43b4dc, load 0.4 when it
started, 8.8 when it ended): 3000 requests in 76.2 s, 1690 cold where the oracle misses 1209;
363 of them joined a load in flight, 166 were hits of the oracle's with none waiting before them
(80 requests were hits slower than 0.25 s); 1256 evictions, the victim's last request a median
3.0 s before (LRU's: 3.1 s), 129 victims requested 4 times more recently than LRU's; no adapter
placed on two replicas. hit_ratio=0.437 burst_hit_ratio=0.558 oracle_hit_ratio=0.597
cold_ttft_p50_s=1.40 cold_ttft_p99_s=2.37. So placement is close to one LRU (no duplicates,
victims as old as LRU's but for one in ten): the loss is the cold path's length, which gathers
the next requests of the adapter behind its load. From the cluster's logs (--requests 1500): the
controller's Loading event to the agent's load answered p50 0.97 s, p90 1.31 (the load is
0.5 s: a placement waits for the sync of its engine under way, and an engine's syncs follow one
another every 0.69 s p50, 1.6 loads each), the load to Resident p50 0.15 s, Resident to the
gateway's table 0.06 s.

Tried on adapters4 and not taken, each interleaved with its base (interleave.py, ABBA,
--requests 1500, load 8-15):
  - the agent's loads beside its syncs (adapters3's), each reported at once as it lands loaded
    (the engine's 200) instead of by a sync of its own, and no write from a sync that changed
    only adaptersSeen (2120e29, reverted), two rounds: hit_ratio 0.438 against 0.422,
    cold_ttft_p50_s 1.71 against 1.53, cold_ttft_p99_s 3.01 against 3.10. In the cluster's logs
    the agent's part shrank (its sight of a placement to the load started p50 0.25 -> 0.21 s,
    the load landed to Resident 0.36 -> 0.25 s, a run each); the cold path did not.
  - the adapter controller passing only over the adapters whose demand a gateway's report
    changed, not every one it names (00109f1, reverted): controller_cpu_s 9.25 against 9.45,
    cold_ttft_p50_s 1.47 against 1.28, p99 2.96 against 2.19.
Where a cold request's time went with the loads beside the syncs (the cluster's logs, --requests
1500, p50 / p90 in s): its first request waiting to the controller's Loading event 0.12-0.25 /
0.37-0.65, to the agent's sight of the placement 0.05-0.06 / 0.14, to its load started
0.21-0.25 / 0.45-0.50, the load 0.55 / 0.60, to Resident 0.25-0.37 / 0.57-0.74, to the gateway's
table 0.05-0.08 / 0.17-0.24. The bench keeps the machine busy itself: at a43b4dc+this bench
(16:00, load 7-13), 3000 requests in 79.2 s, the components spent 73.7 CPU s (etcd 20.4,
controller-manager 19.1, server 15.0, gateway 9.6, agent 9.5) of the 2 cores' 158:
    cold: 337 joined a load in flight, 173 hits of the oracle's with none waiting before them, 77
    slower than 0.25 s and faster than a load; evictions: 1252, victim's last request a median
    3.1 s before (LRU's: 3.1 s); 107 victims requested 4 times more recently than LRU's
    adapters: hit_ratio=0.441 burst_hit_ratio=0.553 oracle_hit_ratio=0.597 cold_ttft_p50_s=1.46
        cold_ttft_p99_s=2.71 restore_s=3.62 cpu_s=73.7 controller_cpu_s=19.1
So no one hop is the loss: six through etcd and three processes, each 0.05-0.37 s at p50 with
every process waiting its turn for a core. A p99 of the load time plus 0.5 s needs fewer hops,
not faster ones: the gateway asking the agent of a replica with a free slot to load the adapter
at once (the control plane recording it after), not built yet. Targets not met.

On the quiet machine at last (main at 4209a92, every branch of the day merged, nothing else
running; load average 2.0 at the start, 5.1 at the end, the bench's own), defaults:
    CPU seconds of the traffic: server 20.3, controller-manager 24.4, gateway 13.6, agent 12.9, etcd 23.9
    cold: 402 joined a load in flight, 177 hits of the oracle's with none waiting before them, 123
    slower than 0.25 s and faster than a load; evictions: 1278, victim's last request a median
    2.2 s before (LRU's: 2.3 s); 152 victims requested 4 times more recently than LRU's
    adapters: hit_ratio=0.418 burst_hit_ratio=0.552 oracle_hit_ratio=0.597 cold_ttft_p50_s=1.09
        cold_ttft_p99_s=1.90 restore_s=1.73 cpu_s=95.0 controller_cpu_s=24.4
  3000 requests in 59.9 s: the components took 95 of the 2 cores' 120 CPU s; hit_ratio 0.70 of
  the oracle's (burst_hit_ratio 0.92), cold p99 1.90 s against 1.0, restore 1.73 s (met).

The direct path (branch direct, 2026-12-06; docs/gateway.md, "LoRA adapters"): the gateway asks
the agent of a replica's rank 0 to load a cold adapter at once (in the place of a victim it
chooses by segmented LRU where the replica is full), routes there on the engine's 200, and the
adapter controller adopts the load after; three hops where there were six. Interleaved with its
base 5052488 (the head at a65f5be; interleave.py --rounds 2, ABBA; load average 1.9 at the start, 8.0 at the end:
other sessions' work), in the order run:
    base  hit_ratio=0.430 burst_hit_ratio=0.556 cold_ttft_p50_s=1.24 cold_ttft_p99_s=2.15 restore_s=3.62 cpu_s=76.7
    head  hit_ratio=0.562 burst_hit_ratio=0.601 cold_ttft_p50_s=1.02 cold_ttft_p99_s=1.76 restore_s=2.86 cpu_s=65.5
    head  hit_ratio=0.556 burst_hit_ratio=0.603 cold_ttft_p50_s=0.89 cold_ttft_p99_s=2.14 restore_s=3.02 cpu_s=62.2
    base  hit_ratio=0.432 burst_hit_ratio=0.556 cold_ttft_p50_s=1.01 cold_ttft_p99_s=1.63 restore_s=2.15 cpu_s=68.9
    base  hit_ratio=0.438 burst_hit_ratio=0.552 cold_ttft_p50_s=0.96 cold_ttft_p99_s=1.60 restore_s=1.88 cpu_s=71.2
    head  hit_ratio=0.534 burst_hit_ratio=0.587 cold_ttft_p50_s=1.03 cold_ttft_p99_s=1.79 restore_s=2.77 cpu_s=60.4
    head  hit_ratio=0.526 burst_hit_ratio=0.582 cold_ttft_p50_s=1.05 cold_ttft_p99_s=1.66 restore_s=1.89 cpu_s=65.6
    base  hit_ratio=0.433 burst_hit_ratio=0.554 cold_ttft_p50_s=1.30 cold_ttft_p99_s=2.44 restore_s=2.99 cpu_s=89.0
    (oracle_hit_ratio=0.597 throughout; the head's slru_oracle_hit_ratio=0.649)
    interleave: hit_ratio=1.260 burst_hit_ratio=1.070 cold_ttft_p50_s=0.911 cold_ttft_p99_s=0.939
        restore_s=1.095 cpu_s=0.863 controller_cpu_s=0.798
  alone before it, at load 1.5: 3000 requests in 41.0 s, 1319 cold (139 joined a load in flight),
  936 evictions, victim's last request a median 1.6 s before (LRU's: 1.6 s)
    adapters: hit_ratio=0.560 burst_hit_ratio=0.607 oracle_hit_ratio=0.597 slru_oracle_hit_ratio=0.649
        cold_ttft_p50_s=0.91 cold_ttft_p99_s=1.41 restore_s=1.79 cpu_s=68.4 controller_cpu_s=16.7
The hit ratio rises from 0.72 of the oracle's to 0.88-0.94 (burst_hit_ratio 0.58-0.61, the oracle's
or more: the segmented LRU's victims), the components spend 14 % less CPU (the controller 20 %
less: it no longer places for demand nor evicts, it adopts), and a cold request's p50 drops 0.1 s;
its p99 hardly moves (0.94 of the base's). Targets: hit_ratio 0.95 of the oracle's (0.567) not met
(0.526-0.562), cold_ttft_p99_s 1.0 not met (1.41 at load 1.5, 1.66-2.14 at load 2-8), restore met.
Where a cold request's time goes now, from the gateway's log of the same runs (its direct loads:
the agent asked, to its 200): p50 0.75-0.79 s, p90 0.93-0.97, p99 1.18-1.21 at load 1.5 (0.89 /
1.15 / 1.39 at load 7), of which the sim's load is 0.5 s: the rest is the agent (a listing of its
engine, the victim's unload, a sync's turn) and two event loops waiting for the 2 cores; the
request then waits for its own turn on the gateway's loop. No direct load failed and no request
met an engine's 404 in the last runs; the early ones of the day lost requests to (and were fixed
for) loads racing for one replica's last slot, a victim whose requests were still on their way,
and an agent's sync unloading a direct load whose placement it had not seen dropped yet. A sync's
loads beside the direct loads' turns (committed with these figures: a direct load no longer waits behind a
sync's loads or pulls), one run at load 2.8 rising to 6.9: hit_ratio=0.520 burst_hit_ratio=0.581
cold_ttft_p50_s=1.08 cold_ttft_p99_s=1.79 restore_s=2.46, direct loads p50 0.89 p90 1.15 p99 1.39:
no better than the noise of the machine's load. At 11af80f (a direct load's expiry its own; a
request let go from its queue that finds the adapter routed nowhere waits again), one run at load
5.8 rising to 11.3: 3000 requests in 68.8 s, 1694 cold (276 joined a load in flight, 326 hits
slower than 0.25 s), direct loads p50 1.04 p90 1.49 p99 1.97 s, one refused (409: the gateway's
table behind the engine; tried again), no engine's 404:
    adapters: hit_ratio=0.435 burst_hit_ratio=0.527 oracle_hit_ratio=0.597 slru_oracle_hit_ratio=0.649
        cold_ttft_p50_s=1.20 cold_ttft_p99_s=2.80 restore_s=4.33 cpu_s=66.9 controller_cpu_s=16.2
(the machine, not the path: at load 11 a hit's answer takes more than the 0.25 s cut). At
dbed3ad, interleaved with the base 5052488 again (ABBA, one round, load 2.6 at the start, 4.8 at
the end), in the order run:
    base  hit_ratio=0.429 burst_hit_ratio=0.554 cold_ttft_p50_s=1.00 cold_ttft_p99_s=1.62 restore_s=1.45 cpu_s=77.1
    head  hit_ratio=0.570 burst_hit_ratio=0.612 cold_ttft_p50_s=0.82 cold_ttft_p99_s=1.45 restore_s=2.33 cpu_s=61.5
    head  hit_ratio=0.559 burst_hit_ratio=0.597 cold_ttft_p50_s=0.88 cold_ttft_p99_s=1.54 restore_s=2.04 cpu_s=67.9
    base  hit_ratio=0.411 burst_hit_ratio=0.548 cold_ttft_p50_s=0.93 cold_ttft_p99_s=1.53 restore_s=1.78 cpu_s=78.2
    interleave: hit_ratio=1.344 burst_hit_ratio=1.097 cold_ttft_p50_s=0.881 cold_ttft_p99_s=0.949
        restore_s=1.353 cpu_s=0.833 controller_cpu_s=0.785
  hit_ratio 0.559-0.570 (0.94-0.95 of the oracle's: the target met in one run of two), cold p99
  1.45-1.54 s (target 1.0: not met), restore 2.0-2.3 s (met; the base's 1.5-1.8). Left: a
cold p99 of load time + 0.5 s needs the agent's part (0.25-0.7 s over the load) shorter under CPU
contention, e.g. a direct load answered without listing the engine first.
Main as merged (1637680: the direct path and the session's other work; the machine quiet at the
start, load 0.4 rising to 5.3 with the bench's own work), two runs:
    adapters: hit_ratio=0.513 burst_hit_ratio=0.575 oracle_hit_ratio=0.597 slru_oracle_hit_ratio=0.649
        cold_ttft_p50_s=1.07 cold_ttft_p99_s=1.74 restore_s=1.86 cpu_s=85.4 controller_cpu_s=20.8
        (1461 cold: 185 joined a load in flight, 216 hits slower than 0.25 s; 942 evictions)
    adapters: hit_ratio=0.537 burst_hit_ratio=0.586 oracle_hit_ratio=0.597 slru_oracle_hit_ratio=0.649
        cold_ttft_p50_s=1.03 cold_ttft_p99_s=1.73 restore_s=2.28 cpu_s=81.5 controller_cpu_s=19.8
        (1389 cold: 148 joined a load in flight, 136 hits slower than 0.25 s; 949 evictions)
The components took 81-85 of the 2 cores' ~100 CPU s of the traffic: hits slower than the 0.25 s
cut count as misses. Targets: hit_ratio 0.86-0.90 of the oracle's here (0.94-0.95 in the helper's
runs above), cold_ttft_p99_s 1.73 (1.0): not met; restore_s met.

CPU per load (2026-12-06, evening, a helper): py-spy on this bench at main 7b5bb86 (200 Hz, 25 s of
the traffic; inclusive samples): the controller-manager spent 26 % of its samples in the adapter
controller's reconcile (placement 8 %, adoption 5 %, its status writes 4 %; the rest the watch's
decoding, grpc and the event loop), most of them passes that wrote nothing: every write of a
Shard's status (an agent's every sync) enqueues every adapter its engine lists and every one
placed on its replica, 10 or more for the one or two that changed. The demand reports and the
Evicted events were small. The agent spent 24 % of its samples choosing what its engine is to
hold (AdapterBook.wanted_on: a scan of all 1,000 Adapters per sync), 20 % in aiohttp writes.
Taken: the agent keeps the adapters placed on each replica by its watch (10.1 CPU s in the run
below against 13.7). Tried and not taken: a Shard's event enqueuing only the adapters whose
status its report disagrees with; interleaved with 7b5bb86 (ABBA, two rounds, load 0.8-5.8), both
changes together: base hit_ratio 0.551-0.564, cold_ttft_p99_s 1.58-2.00, cpu_s 68.8-73.7 / head
0.539-0.573, 1.13-1.67, 56.4-71.8 (medians: cpu_s 0.96, controller_cpu_s 0.94, cold p99 0.89 of
the base's), but one head run's restore took 294 s: with its first version an Evicted report
went unread and the Adapter's status named the killed replica resident until the agent's
eviction hold (DIRECT_HOLD, 300 s) ran out. A second version ran three times without it; not
taken without the cause proven. One run with both (load 5): hit_ratio=0.551 cold_ttft_p99_s=1.90
restore_s=1.86 cpu_s=67.9 controller_cpu_s=16.5.
Main with the agent's index alone (632de95), the machine quiet at the start (load 0.1 -> 3.5):
    adapters: hit_ratio=0.528 burst_hit_ratio=0.580 oracle_hit_ratio=0.597 slru_oracle_hit_ratio=0.649
        cold_ttft_p50_s=0.98 cold_ttft_p99_s=1.49 restore_s=1.69 cpu_s=73.4 controller_cpu_s=18.0
    (3000 requests in 45.3 s, 1415 cold: 156 joined a load in flight, 196 hits slower than 0.25 s)
Targets: hit_ratio 0.88 of the oracle's (0.95), cold_ttft_p99_s 1.49 (1.0): not met; restore met.

The slow restores, found (2026-12-06, late; a helper): main 3d359a4 itself took 276-284 s in 3
of 6 interleaved runs, and 281 s in one of its own, so the Shard-event filter above was not their
cause. A cluster caught in one: nine adapters placed on the killed replica, of eight slots (the
controller had placed one there while the engine was full of direct loads it had not adopted yet;
adoption counts no slots); the rebuilt engine loaded the first eight by name, leaving out one that
had been resident, which waited for a slot until another's demand placement ended
(adapter_idle_seconds, 300 s). Now an engine started again is given what it listed before first.
A restore past 15 s prints what the Adapters not back say, and what the shard reports of them.
With that, and an Adapter pinned by its digest read from the weights cache (no source asked; the
bench's adapters are paths, which it does not change), interleaved ABBA with 235cd6b (load 0.6-7):
    235cd6b hit_ratio=0.558, 0.560 cold_ttft_p99_s=1.53, 1.24 restore_s=2.10, 2.00 cpu_s=73.6, 64.4
    this    hit_ratio=0.552, 0.563 cold_ttft_p99_s=1.47, 1.25 restore_s=2.45, 1.50 cpu_s=66.5, 60.1
    interleave: hit_ratio=0.997 cold_ttft_p99_s=0.982 restore_s=0.963 cpu_s=0.917
The filter, with these, in a round just before (load 0.6-7): hit_ratio 0.552-0.554 against
0.564-0.566, cold p99 1.52-1.53 against 1.32-1.43; the helper's three rounds of the filter with a
direct load answered from the agent's own record of the engine (no listing) ran the same way
(cold p50 0.89-0.93 against 0.79-0.85, hit_ratio 0.965 of main's): neither taken.
Targets on main here: hit_ratio 0.93-0.95 of the oracle's (0.95), cold_ttft_p99_s 1.24-1.53
(1.0): not met; restore_s met (the 281 s restores gone with the change).

The targets met (2026-12-07, early). py-spy on the gateway during the traffic (main f09b5eb): 70 %
of its samples rebuilt the routing table's index over all 1,000 adapters, at each of ~5,000
residency changes (a status, a direct load, an eviction); an adapter's change now routes that
adapter alone (d477e78): the gateway's CPU 12-14 -> 4-6 s, cold p50 1.14-1.23 -> 0.80-0.89 s
(interleaved with f09b5eb, two rounds, a helper's load beside them). But the hit ratio fell
(0.51 -> 0.48-0.53): the traffic is closed-loop, so a faster cold path sends more requests a
second, and more loads are in flight at once. The gateway's log showed 25-29 loads in flight
(of 64 slots) and victims requested 0.5-0.7 s before, where LRU's was 1.2-2 s: an adapter loaded
directly was no victim until its status recorded it (0.3-0.6 s on), so the ones loaded last held
the slots and older, busier ones went. A discrete-event model of this bench (32 clients, the
slots, a 0.62 s load, the victims' rules) put the hit ratio at 0.531 with that hold, 0.607
without it, 0.41 with a 1 s hold. The hold dropped (4e6ba6e; a direct load may go once its
requests are served), interleaved with d477e78 (ABBA, two rounds, load 2-7), in the order run:
    base  hit_ratio=0.481 cold_ttft_p50_s=0.65 cold_ttft_p99_s=1.63 restore_s=2.28 cpu_s=57.0
    head  hit_ratio=0.599 cold_ttft_p50_s=0.69 cold_ttft_p99_s=1.04 restore_s=3.25 cpu_s=45.9
    head  hit_ratio=0.598 cold_ttft_p50_s=0.70 cold_ttft_p99_s=1.05 restore_s=2.74 cpu_s=45.8
    base  hit_ratio=0.492 cold_ttft_p50_s=0.61 cold_ttft_p99_s=1.63 restore_s=1.98 cpu_s=51.5
    base  hit_ratio=0.496 cold_ttft_p50_s=0.64 cold_ttft_p99_s=1.27 restore_s=1.67 cpu_s=52.9
    head  hit_ratio=0.605 cold_ttft_p50_s=0.65 cold_ttft_p99_s=0.95 restore_s=2.58 cpu_s=42.0
    head  hit_ratio=0.601 cold_ttft_p50_s=0.65 cold_ttft_p99_s=0.94 restore_s=2.79 cpu_s=41.6
    base  hit_ratio=0.527 cold_ttft_p50_s=0.62 cold_ttft_p99_s=1.44 restore_s=1.60 cpu_s=47.6
    interleave: hit_ratio=1.215 burst_hit_ratio=1.108 cold_ttft_p50_s=1.063 cold_ttft_p99_s=0.648
        restore_s=1.515 cpu_s=0.841 controller_cpu_s=0.901
  main as merged (4e6ba6e), the machine quiet (load 0.9 at the start, 3.3 at the end): 3000
  requests in 25.1 s, 1197 cold (89 joined a load in flight), 404 evictions by the controller
  (a direct load taken before its status recorded it is no eviction of its), direct loads p50
  0.61 p90 0.74 p99 0.87 s (the sim's load is 0.5 s); the components 42 CPU s (etcd 9.5,
  controller-manager 11.4, server 8.8, agent 8.2, gateway 4.1):
    adapters: hit_ratio=0.601 burst_hit_ratio=0.631 oracle_hit_ratio=0.597 slru_oracle_hit_ratio=0.649
        cold_ttft_p50_s=0.63 cold_ttft_p99_s=0.93 restore_s=2.20 cpu_s=42.1 controller_cpu_s=11.4
Targets: hit_ratio 1.00-1.01 of the oracle's (0.95): met; cold_ttft_p99_s 0.93 quiet, 0.94-1.05
beside the interleave's other runs (1.0): met on the quiet machine, at the edge under load;
restore_s 2.2-3.3 (10): met. The restore is slower than the base's (1.6-2.3 s): more adapters
are resident on the killed replica, and each is loaded again.

Requests that met an engine's 404 (the gateway's log, "failed before its first byte"): 1 to 5 a
run after 4e6ba6e, and one run in about 13 ended in a 503 (a request's second loss): a direct
load evicted before its status recorded it was adopted by the controller from the shard's report
from before the unload, and the gateway, which had forgotten the eviction at a status not naming
the replica, routed it back (7ba5f0c keeps it out); and a victim the agent kept stayed out of
routing for a minute while its engine held it (ba71a3d routes it again). After them, 0 in each of
three runs counted. Main as it lands (after 7ba5f0c), the machine quiet at the start (load 0.5
and 2.9 rising to 2.9 and 4.4):
    adapters: hit_ratio=0.605 burst_hit_ratio=0.634 oracle_hit_ratio=0.597 slru_oracle_hit_ratio=0.649
        cold_ttft_p50_s=0.68 cold_ttft_p99_s=0.95 restore_s=2.35 cpu_s=45.4 controller_cpu_s=12.2
    adapters: hit_ratio=0.598 burst_hit_ratio=0.630 oracle_hit_ratio=0.597 slru_oracle_hit_ratio=0.649
        cold_ttft_p50_s=0.75 cold_ttft_p99_s=1.10 restore_s=2.41 cpu_s=50.7 controller_cpu_s=13.7
    (3000 requests in 27-30 s, 1184-1207 cold, direct loads p50 0.66-0.72 p99 0.93-1.00 s)
Over the 20 uninstrumented runs of 4e6ba6e and after (alone and interleaved, load 0.5-7):
hit_ratio 0.598-0.605 (1.00-1.01 of the oracle's: met), restore_s 1.8-3.3 (met), cold_ttft_p99_s
0.89-1.21, median 1.00 (at most 1.0 in 11 of 20). What is left of a cold request's time is the
event loops waiting for a core: the agent's log of a direct load (instrumented, p50 / its slowest
5 %): the gateway's ask to the agent's handler 41 / 77 ms, each await there ~20 / 50 ms, the
agent's turn behind a sync 0 / 118 ms, the sim's 0.5 s load 542 / 577 ms; the components keep
about 1.6 of the 2 cores busy, the sims, this bench and the kernel most of the rest.

2026-12-07, at ad233c0 (the machine quiet, load 0.4-5): cold_ttft_p99_s 1.06, 1.12, 1.02, 1.02,
0.95 (hit_ratio 0.598-0.604, restore_s 2.1-2.8). Where the controller-manager's 11-13 CPU s go:
11,810 adapter reconciles in one run's traffic (3,000 requests; 594 Shard status writes and 567
demand reports through the server), most finding nothing to write. The adapter controller
looking only at the adapters whose figures a gateway's report changed, not every one it names,
tried again now that the gateways load directly (one round, interleaved): controller_cpu_s 12.8
and 11.9 against 11.9 and 11.4, cold_ttft_p99_s 1.09 and 1.02 against 1.02 and 0.95: not taken
(as 00109f1 before it).
"""
from __future__ import annotations

import argparse
import asyncio
import bisect
import itertools
import os
import random
import signal
import sys
import tempfile
import time
from collections import OrderedDict
from datetime import datetime
from pathlib import Path

import aiohttp

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from llmgw.api import LoraAdapter, Model, Replica, Shard  # noqa: E402
from llmgw.client import Client, ClientConfig  # noqa: E402
from llmgw.dev.cluster import LocalCluster, NodePlan  # noqa: E402
from llmgw.dev.process import free_port  # noqa: E402

BASE = "base"


def zipf_draws(n: int, s: float, count: int, seed: int) -> list[int]:
    """`count` ranks in [0, n) drawn from Zipf(s) (rank 0 the most likely)."""
    cumulative = list(itertools.accumulate(1.0 / (k + 1) ** s for k in range(n)))
    rng = random.Random(seed)
    return [bisect.bisect_left(cumulative, rng.random() * cumulative[-1]) for _ in range(count)]


def hit_ratio(draws: list[int], capacity: int, protected: float = 0.0) -> float:
    """The draws' hit ratio through one cache of `capacity` entries, a segmented LRU: an entry hit
    again moves to the protected segment (at most `protected` of the capacity; its least recent
    entry back to the probationary one, as the most recent there), and a miss evicts the
    probationary segment's least recent entry (the protected one's when it is empty). protected 0
    is one LRU (the oracle); 0.8 the policy of the gateway's victims (llmgw/gateway/loads.py)."""
    probation: OrderedDict[int, None] = OrderedDict()
    kept: OrderedDict[int, None] = OrderedDict()
    hits = 0
    for d in draws:
        if d in kept:
            hits += 1
            kept.move_to_end(d)
        elif d in probation:
            hits += 1
            del probation[d]
            kept[d] = None
            if len(kept) > int(capacity * protected):
                probation[kept.popitem(last=False)[0]] = None
        else:
            probation[d] = None
            if len(probation) + len(kept) > capacity:
                (probation if probation else kept).popitem(last=False)
    return hits / len(draws)


async def ttft(http: aiohttp.ClientSession, url: str, adapter: str) -> float:
    start = time.time()
    body = {"model": adapter, "prompt": "hello", "max_tokens": 2, "stream": True}
    async with http.post(url + "/v1/completions", json=body) as r:
        if r.status != 200:
            raise RuntimeError(f"{adapter}: {r.status} {(await r.text())[:200]}")
        await r.content.readline()
        first = time.time() - start
        await r.read()
    return first


async def known(url: str, name: str) -> None:
    """Until the gateway's table has the adapter (a name it never saw is a 404, not a wait)."""
    async with aiohttp.ClientSession() as http:
        while True:
            async with http.post(url + "/v1/completions", json={"model": "not-an-adapter"}) as r:
                if name in await r.text():
                    return
            await asyncio.sleep(0.2)


def cpu_seconds(cluster: LocalCluster) -> dict[str, float]:
    """Each component's CPU seconds so far: its process's user and system time (/proc/PID/stat)."""
    pids = {name: p.pid for name, p in cluster.procs.items()}
    pids.update(("etcd", m.proc.pid) for m in (cluster.etcd.members if cluster.etcd else []) if m.proc)
    spent = {}
    for name, pid in pids.items():
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        spent[name] = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return spent


SLOW_RESTORE = 15.0    # seconds of restore after which the adapters not back yet are described


async def restore(client: Client) -> float:
    """Kill the engine of the replica holding the most adapters; seconds until they are all
    resident on it again."""
    adapters, _ = await client.list(LoraAdapter)
    held: dict[str, set[str]] = {}
    for a in adapters:
        for r in a.status.resident:
            held.setdefault(r, set()).add(a.name)
    victim = max(held, key=lambda r: len(held[r]))
    held[victim] = await settled(client, victim)
    shard = await serving(client, victim)
    assert shard.status.pid is not None
    print(f"killing {victim}'s engine (pid {shard.status.pid}), resident: {sorted(held[victim])}", flush=True)
    start = time.monotonic()
    os.kill(shard.status.pid, signal.SIGKILL)
    told = False
    while True:
        await asyncio.sleep(0.1)
        replica = await client.get(Replica, victim)
        if replica.status.phase != "Ready" or replica.status.restarts == 0:
            continue
        adapters, _ = await client.list(LoraAdapter)
        now = {a.name for a in adapters if victim in a.status.resident}
        if held[victim] <= now:
            return time.monotonic() - start
        if not told and time.monotonic() - start > SLOW_RESTORE:
            told = True
            await tell_missing(client, victim, [a for a in adapters if a.name in held[victim] - now])


async def settled(client: Client, replica: str, within: float = 10.0) -> set[str]:
    """The adapters resident on the replica once the Adapters' statuses and its serving shard's
    report agree (`within` seconds at most; then those both name). Right after the traffic a
    status may still name an adapter a direct load just evicted there, which no restore brings
    back: taken as resident, it kept the restore waiting forever (seen once in about 40 runs)."""
    deadline = time.monotonic() + within
    while True:
        adapters, _ = await client.list(LoraAdapter)
        by_status = {a.name for a in adapters if replica in a.status.resident}
        loaded = {e.name for e in (await serving(client, replica)).status.adapters if e.state == "Loaded"}
        if by_status == loaded or time.monotonic() > deadline:
            return by_status & loaded
        await asyncio.sleep(0.2)


async def serving(client: Client, replica: str) -> Shard:
    """The replica's serving shard (rank 0)."""
    [shard] = [s for s in (await client.list(Shard))[0] if s.spec.replica == replica and s.spec.rank == 0]
    return shard


async def tell_missing(client: Client, replica: str, missing: list[LoraAdapter]) -> None:
    """What the Adapters not resident again say, and what the replica's serving shard reports of them."""
    shard = await serving(client, replica)
    entries = {e.name: e for e in shard.status.adapters}
    print(f"restore past {SLOW_RESTORE:g} s: shard {shard.name} adaptersSeen {shard.status.adaptersSeen}, "
          f"lists {len(entries)}", flush=True)
    for a in missing:
        entry = entries.get(a.name)
        print(f"  {a.name}: placement {a.status.placement} resident {a.status.resident} pending "
              f"{[(p.replica, p.reason, p.message) for p in a.status.pending]}; the shard lists it "
              f"{(entry.state, entry.message) if entry else None}", flush=True)


async def bench(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory(prefix="llmgw-adapters-") as tmp:
        weights = Path(tmp) / "lora"
        weights.mkdir()
        cluster = LocalCluster(Path(tmp) / "cluster", [NodePlan("node01", "ib-a")], gateway_port=free_port(),
                               gateway_args=["--queue-timeout", "120"])
        try:
            cluster.start()
            async with Client.from_config(ClientConfig.load(cluster.admin_config)) as client:
                await client.create(Model.model_validate({"metadata": {"name": BASE}, "spec": {
                    "replicas": args.replicas, "adapters": {"maxLoaded": args.slots},
                    "profiles": [{"engine": "sim", "args": ["--lora-load-seconds", str(args.load_seconds)]}]}}))
                names = [f"lora-{i:04d}" for i in range(args.adapters)]
                for name in names:
                    await client.create(LoraAdapter.model_validate({"metadata": {"name": name}, "spec": {
                        "baseModel": BASE, "source": str(weights), "minReplicas": 0}}))
                while sum(r.spec.model == BASE and r.status.phase == "Ready"
                          for r in (await client.list(Replica))[0]) < args.replicas:
                    await asyncio.sleep(0.2)
                await known(cluster.gateway_url, names[-1])
                draws = zipf_draws(args.adapters, args.zipf, args.requests, args.seed)
                times: list[float] = [0.0] * len(draws)
                sent: list[float] = [0.0] * len(draws)
                queue = iter(enumerate(draws))
                cpu0 = cpu_seconds(cluster)
                t0 = time.monotonic()
                timeout = aiohttp.ClientTimeout(total=180)
                async with aiohttp.ClientSession(timeout=timeout, connector=aiohttp.TCPConnector(limit=0)) as http:
                    async def worker() -> None:
                        for i, d in queue:
                            sent[i] = time.time()
                            times[i] = await ttft(http, cluster.gateway_url, names[d])
                    await asyncio.gather(*(worker() for _ in range(args.concurrency)))
                elapsed = time.monotonic() - t0
                cpu = {name: spent - cpu0[name] for name, spent in cpu_seconds(cluster).items()}
                print("CPU seconds of the traffic: " + ", ".join(f"{n} {s:.1f}" for n, s in cpu.items()), flush=True)
                evictions = [(datetime.fromisoformat(e["time"]).timestamp(), int(e["name"][len("lora-"):]))
                             for e in (await client.list_events(LoraAdapter))[0] if e["reason"] == "Evicted"]
                placed = [len(a.status.placement) for a in (await client.list(LoraAdapter))[0]]
                print(f"after the traffic: {sum(placed)} placements, {sum(p > 1 for p in placed)} adapters "
                      f"placed on more than one replica", flush=True)
                restore_s = await restore(client)
        finally:
            cluster.stop()
    joined = losses(args, draws, sent, times, evictions)
    report(args, draws, times, elapsed, restore_s, joined, cpu)


def losses(args: argparse.Namespace, draws: list[int], sent: list[float], times: list[float],
           evictions: list[tuple[float, int]]) -> int:
    """Where the hits the oracle makes are lost: cold requests sent while an earlier one for the
    same adapter still waited (joined a load), cold ones the oracle's LRU would have hit with none
    waiting before them (the adapter evicted, or not yet resident after an eviction), hits slower
    than the cut; and each eviction's victim against LRU's: the seconds since the victim's last
    request, and since the last request of the adapter LRU would evict then (the least recent of
    the fleet's slots' worth of adapters requested last)."""
    cut = args.load_seconds / 2
    oracle: OrderedDict[int, None] = OrderedDict()
    waiting: dict[int, float] = {}      # adapter -> when the last cold request for it got its first token
    joined = lost = 0
    for i in sorted(range(len(draws)), key=lambda i: sent[i]):
        d = draws[i]
        hit = d in oracle
        oracle[d] = None
        oracle.move_to_end(d)
        if len(oracle) > args.replicas * args.slots:
            oracle.popitem(last=False)
        if times[i] <= cut:
            continue
        if waiting.get(d, 0.0) > sent[i]:
            joined += 1
        elif hit:
            lost += 1
        waiting[d] = max(waiting.get(d, 0.0), sent[i] + times[i])
    slow = sum(cut < t < args.load_seconds for t in times)
    print(f"cold: {joined} joined a load in flight, {lost} hits of the oracle's with none waiting before them, "
          f"{slow} slower than {cut:.2f} s and faster than a load")
    order = sorted(range(len(draws)), key=lambda i: sent[i])
    ages, ideal = [], []
    for at, victim in sorted(evictions):
        last: dict[int, float] = {}
        for i in order:
            if sent[i] > at:
                break
            last[draws[i]] = sent[i]
        recent = sorted(last.values(), reverse=True)
        ages.append(at - last.get(victim, sent[order[0]]))
        ideal.append(at - recent[min(len(recent), args.replicas * args.slots) - 1])
    if ages:
        q = len(ages) // 2
        print(f"evictions: {len(ages)}, victim's last request a median {sorted(ages)[q]:.1f} s before "
              f"(LRU's: {sorted(ideal)[q]:.1f} s); {sum(a < i / 4 for a, i in zip(ages, ideal, strict=True))} "
              f"victims requested 4 times more recently than LRU's")
    return joined


def report(args: argparse.Namespace, draws: list[int], times: list[float], elapsed: float, restore_s: float,
           joined: int, cpu: dict[str, float]) -> None:
    cold = sorted(t for t in times if t > args.load_seconds / 2)

    def quantile(q: float) -> float:
        return cold[min(len(cold) - 1, int(q * len(cold)))] if cold else 0.0
    print(f"{len(times)} requests in {elapsed:.1f} s, {len(cold)} cold, {len(set(draws))} adapters requested")
    print(f"adapters: hit_ratio={1 - len(cold) / len(times):.3f} "
          f"burst_hit_ratio={1 - (len(cold) - joined) / len(times):.3f} "
          f"oracle_hit_ratio={hit_ratio(draws, args.replicas * args.slots):.3f} "
          f"slru_oracle_hit_ratio={hit_ratio(draws, args.replicas * args.slots, 0.8):.3f} "
          f"cold_ttft_p50_s={quantile(0.5):.2f} cold_ttft_p99_s={quantile(0.99):.2f} restore_s={restore_s:.2f} "
          f"cpu_s={sum(cpu.values()):.1f} controller_cpu_s={cpu['controller-manager']:.1f}")


# (flag, type, default, help)
OPTIONS = (
    ("--adapters", int, 1000, "Adapters of the base model, at minReplicas 0"),
    ("--replicas", int, 8, "of the base model, one fake GPU each (at most 8)"),
    ("--slots", int, 8, "adapters a replica holds (spec.adapters.maxLoaded)"),
    ("--load-seconds", float, 0.5, "the sim's time per adapter load"),
    ("--requests", int, 3000, "streamed completions, each for a Zipf-drawn adapter"),
    ("--concurrency", int, 32, "clients sending back to back"),
    ("--zipf", float, 1.1, "the popularity's exponent"),
    ("--seed", int, 1, "of the draws"),
)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    for flag, kind, default, help_ in OPTIONS:
        p.add_argument(flag, type=kind, default=default, help=f"{help_} (default: {default})")
    asyncio.run(bench(p.parse_args()))


if __name__ == "__main__":
    main()

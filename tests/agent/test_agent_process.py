"""Engine process handling with real processes: own session, identity across pid reuse,
SIGTERM-then-SIGKILL of the whole group, log tails, and the state directory's records."""
from __future__ import annotations

import asyncio
import json
import os
import signal
import sys

from llmgw.agent import process
from llmgw.agent.runner import EngineProcess, terminate
from llmgw.agent.state import ProcessRecord, ShardRecord, StateDir
from tests.fixtures.poll import until

# Ignores SIGTERM, starts a child that ignores it too, prints both pids, then waits forever.
STUBBORN = """
import os, signal, subprocess, sys, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)
child = subprocess.Popen([sys.executable, "-c",
    "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(600)"])
print(os.getpid(), child.pid, flush=True)
time.sleep(600)
"""

POLITE = "import time; print('serving', flush=True); time.sleep(600)"


async def start(tmp_path, code: str, name: str = "engine") -> EngineProcess:
    log = tmp_path / f"{name}.log"
    child = await process.spawn([sys.executable, "-c", code], dict(os.environ), log, tmp_path)
    rec = ProcessRecord(name=name, pid=child.pid, start_time=process.start_time(child.pid), log=str(log))
    return EngineProcess(rec, child)


async def wait_log(path, text):
    return await until(lambda: path.exists() and text in path.read_text() and path.read_text(),
                       f"{path} to contain {text!r}")


async def test_engine_runs_in_its_own_session_and_group(tmp_path):
    p = await start(tmp_path, POLITE)
    try:
        await wait_log(tmp_path / "engine.log", "serving")
        assert os.getpgid(p.pid) == p.pid
        assert os.getsid(p.pid) == p.pid
        assert os.getsid(p.pid) != os.getsid(0)
    finally:
        await terminate([p], 5, "test")
    assert await p.waiter() == -signal.SIGTERM


async def test_sigterm_then_sigkill_of_the_whole_group(tmp_path):
    p = await start(tmp_path, STUBBORN)
    text = await wait_log(tmp_path / "engine.log", " ")
    leader, child = map(int, text.split())
    assert sorted(process.group_members(p.pid)) == sorted([leader, child])
    await terminate([p], grace=0.3, label="test")
    assert process.group_members(p.pid) == []
    assert not process.is_alive(child)
    assert process.exit_description(await p.waiter()) == (137, "was killed by signal SIGKILL")


# A head like `ray start --block`: on SIGTERM it stops its child itself (SIGKILL, no SIGTERM)
# and exits 1; its child and the server note any SIGTERM they get. All append to argv[1].
NOTE_SIGTERM = (
    "import signal, sys, time\n"
    "def term(*_):\n"
    "    open(sys.argv[1], 'a').write(sys.argv[2] + ' got SIGTERM\\n'); sys.exit(0)\n"
    "signal.signal(signal.SIGTERM, term)\n"
    "print(sys.argv[2], 'up', flush=True)\n"
    "time.sleep(600)\n"
)
HEAD = (
    "import signal, subprocess, sys, time\n"
    f"child = subprocess.Popen([sys.executable, '-c', {NOTE_SIGTERM!r}, sys.argv[1], 'child'])\n"
    "def term(*_):\n"
    "    open(sys.argv[1], 'a').write('head got SIGTERM\\n'); child.kill(); child.wait(); sys.exit(1)\n"
    "signal.signal(signal.SIGTERM, term)\n"
    "time.sleep(600)\n"
)


async def test_programs_stop_in_reverse_start_order_and_a_leader_stops_its_own_children(tmp_path):
    order = tmp_path / "order"
    procs = []
    for name, code, leader in (("head", HEAD, True), ("serve", NOTE_SIGTERM, False)):
        log = tmp_path / f"{name}.log"
        child = await process.spawn([sys.executable, "-c", code, str(order), name], dict(os.environ), log, tmp_path)
        rec = ProcessRecord(name=name, pid=child.pid, start_time=process.start_time(child.pid), log=str(log),
                            term_leader=leader)
        procs.append(EngineProcess(rec, child))
    await wait_log(tmp_path / "head.log", "child up")
    await wait_log(tmp_path / "serve.log", "serve up")
    await terminate(procs, grace=30, label="test")
    assert order.read_text().splitlines() == ["serve got SIGTERM", "head got SIGTERM"]
    assert [await p.waiter() for p in procs] == [1, 0]     # stopped within the grace: no SIGKILL
    assert all(process.group_members(p.pid) == [] for p in procs)


async def test_a_recycled_pid_is_not_the_same_process(tmp_path):
    p = await start(tmp_path, POLITE)
    try:
        assert process.is_alive(p.pid, p.record.start_time)
        assert not process.is_alive(p.pid, p.record.start_time + 1)
        adopted = EngineProcess(ProcessRecord("engine", p.pid, p.record.start_time + 1, p.record.log))
        assert not adopted.has_processes(), "a stranger with our old pid would be signalled"
    finally:
        await terminate([p], 5, "test")
    assert not process.is_alive(p.pid)


async def test_an_adopted_process_is_watched_by_pid_and_start_time(tmp_path):
    p = await start(tmp_path, POLITE)
    adopted = EngineProcess(p.record)          # as a restarted agent sees it: not its child
    assert adopted.alive() and not adopted.waiter().done()
    os.kill(p.pid, signal.SIGKILL)
    await p.waiter()                           # reaped by us (its parent), as init would
    assert await asyncio.wait_for(adopted.waiter(), 30) is None   # exit code unknowable


def test_exit_descriptions():
    assert process.exit_description(0) == (0, "exited with code 0")
    assert process.exit_description(3) == (3, "exited with code 3")
    assert process.exit_description(-15) == (143, "was killed by signal SIGTERM")
    assert process.exit_description(None)[0] is None


def test_tail_reads_the_last_lines(tmp_path):
    log = tmp_path / "x.log"
    log.write_text("".join(f"line {i}\n" for i in range(100)))
    assert process.tail(log, 3) == ["line 97", "line 98", "line 99"]
    assert process.tail(tmp_path / "absent.log", 3) == []


def test_state_records_round_trip_and_bad_ones_are_skipped(tmp_path, caplog):
    state = StateDir(tmp_path / "state")
    state.prepare()
    rec = ShardRecord(shard="s-1", uid="u-1", probe_kind="http", probe_url="http://127.0.0.1:1/health",
                      processes=[ProcessRecord("sim", 123, 456, "/l/sim.log", serves=True)])
    state.save(rec)
    (state.shards / "broken.json").write_text("{not json")
    loaded = state.load_all()
    assert loaded == {"s-1": rec}
    assert json.loads((state.shards / "s-1.json").read_text())["processes"][0]["start_time"] == 456
    assert "broken.json" in caplog.text
    state.remove("s-1")
    assert "s-1" not in state.load_all()


def test_unwritable_state_dir_is_named(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    try:
        StateDir(blocker / "state").prepare()
    except OSError as err:
        assert str(blocker / "state") in str(err)
    else:
        raise AssertionError("prepare() under a file succeeded")

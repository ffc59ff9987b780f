"""The agent's shard status reporter (llmgw/agent/reporter.py): one write per status wanted."""
from __future__ import annotations

import asyncio

from llmgw.agent.reporter import StatusReporter
from llmgw.api import ShardStatus


async def test_a_shard_forgotten_while_another_is_written_is_not_written_and_the_reporter_goes_on():
    """A shard removed (its runner ended: a replica rebuilt after its engine was killed) while the
    reporter writes another's status is skipped: in hack/bench/adapters.py's restore the agent
    died of a KeyError there, and the node with it."""
    writing = asyncio.Event()
    go_on = asyncio.Event()
    written: list[str] = []

    async def write(name: str, node: str, status: dict) -> ShardStatus:
        written.append(name)
        if name == "first":
            writing.set()
            await go_on.wait()
        return ShardStatus.model_validate(status)

    reporter = StatusReporter(write, "node01")
    reporter.want("first", ShardStatus(phase="Ready"))
    reporter.want("second", ShardStatus(phase="Ready"))
    task = asyncio.create_task(reporter.run())
    try:
        await writing.wait()
        reporter.forget("second")
        go_on.set()
        reporter.want("third", ShardStatus(phase="Starting"))
        while "third" not in written:
            assert not task.done(), task.exception()
            await asyncio.sleep(0.01)
        assert written == ["first", "third"]
        assert reporter.pending() == []
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)

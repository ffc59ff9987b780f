"""Helpers for the gateway tests: sim engines as subprocesses, objects, an in-process gateway.

    from tests.helpers.gateway import Sim, model, replica, running_gateway

    sim = Sim.start("llama", "llama-small", extra=["--tokens-per-second", "20"])   # real `llmgw sim`
    async with running_gateway(table) as gw:        # Gateway on a real loopback socket
        gw.url, gw.gateway (the Gateway), gw.table
    sim.stop() / sim.kill()
    metric(await scrape(session, gw), "llmgw_gateway_requests_total", code="200")
"""
from __future__ import annotations

import contextlib
import signal
import subprocess
import sys
import urllib.request
from dataclasses import dataclass
from datetime import datetime, timezone

from llmgw.api import Model, Replica
from llmgw.dev.process import free_port
from llmgw.gateway.gateway import Gateway
from llmgw.gateway.table import RoutingTable
from tests.helpers.poll import until_sync

CLI = [sys.executable, "-c", "from llmgw.cli.main import cli; cli()"]



@dataclass
class Sim:
    """A real `llmgw sim` engine (rank 0 of 1) on a loopback port."""

    port: int
    proc: subprocess.Popen

    @property
    def endpoint(self) -> str:
        return f"127.0.0.1:{self.port}"

    @classmethod
    def start(cls, *names: str, extra: list[str] | tuple = (), wait: bool = True) -> "Sim":
        port = free_port()
        proc = subprocess.Popen(
            [*CLI, "sim", "--host", "127.0.0.1", "--port", str(port), "--served-model-name", *names,
             "--drain-grace", "5", *extra],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        sim = cls(port, proc)
        if wait:
            sim.wait_ready()
        return sim

    def wait_ready(self, timeout: float = 30.0) -> None:
        def healthy() -> bool:
            if self.proc.poll() is not None:
                raise RuntimeError(f"sim on port {self.port} exited with {self.proc.returncode}")
            try:
                with urllib.request.urlopen(f"http://{self.endpoint}/health", timeout=1):
                    return True
            except OSError:
                return False
        until_sync(healthy, f"sim on port {self.port} to answer /health", timeout=timeout)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.kill()


def model(name: str, aliases: tuple[str, ...] = (), replicas: int = 1) -> Model:
    return Model.model_validate({
        "metadata": {"name": name},
        "spec": {"replicas": replicas, "aliases": list(aliases), "profiles": [{"engine": "sim"}]},
    })


def replica(name: str, model_name: str, endpoint: str | None, phase: str = "Ready",
            served: tuple[str, ...] = (), deleting: bool = False) -> Replica:
    return Replica.model_validate({
        "metadata": {"name": name,
                     "deletionTimestamp": datetime.now(timezone.utc) if deleting else None},
        "spec": {"model": model_name, "templateHash": "t1", "profile": {"engine": "sim"},
                 "servedModelNames": list(served)},
        "status": {"phase": phase, "endpoint": endpoint},
    })


@dataclass
class RunningGateway:
    gateway: Gateway
    url: str

    @property
    def table(self) -> RoutingTable:
        return self.gateway.table


@contextlib.asynccontextmanager
async def running_gateway(table: RoutingTable | None = None, **kw):
    gw = Gateway(table, **kw)
    port = await gw.start("127.0.0.1", 0)
    try:
        yield RunningGateway(gw, f"http://127.0.0.1:{port}")
    finally:
        await gw.stop()


async def scrape(session, gw) -> str:
    """The gateway's /metrics text, fetched with an aiohttp session."""
    async with session.get(gw.url + "/metrics") as m:
        return await m.text()


def metric(text: str, name: str, **labels: str) -> float:
    """The sum of the samples of `name` whose labels include `labels` (0.0 when none)."""
    total = 0.0
    for line in text.splitlines():
        if not line.startswith(name + "{") and line.split(" ")[0] != name:
            continue
        head, _, value = line.rpartition(" ")
        if all(f'{k}="{v}"' in head for k, v in labels.items()):
            total += float(value)
    return total

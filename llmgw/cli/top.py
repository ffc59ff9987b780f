"""`llmgw top`: models, replicas and nodes with their live request rate, latency and GPUs.

Read from the components' /metrics (docs/metrics.md): the gateways' (requests, time to first
token, tokens, requests in flight), the controller-manager's (replicas by phase, GPUs per node)
and the agents' (their engines' queues and KV cache). Each refresh scrapes them all and shows
the rates since the one before. Where they are: --metrics, else a `llmgw dev up` cluster's
cluster.json in --dir, else what the cluster announces through the API, as `kubectl top` finds
its way from the config file alone: each Node's status.agentMetrics, and the servers',
controller-managers' and gateways' metrics addresses under their leases (`GET /members`).
"""
from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import aiohttp
import click
from rich.console import Group, RenderableType
from rich.live import Live
from rich.text import Text

from llmgw.api import Node
from llmgw.cli.connect import Connection, connection_options
from llmgw.cli.connect import run as run_verb
from llmgw.cli.errors import USAGE, CliError
from llmgw.cli.metricsview import MODEL_HEADERS, NODE_HEADERS, REPLICA_HEADERS, Scrape, View, view
from llmgw.printers.table import format_table, rich_table

DEFAULT_DIR = ".llmgw-dev"   # `llmgw dev up`'s


def targets(metrics: tuple[str, ...], directory: str, conn: Connection) -> list[str]:
    """The /metrics URLs to read: --metrics, else every component of the dev cluster in `directory`,
    else every one the cluster of the connection announces."""
    if metrics:
        return [m if "://" in m else f"http://{m}/metrics" for m in metrics]
    state = Path(directory) / "cluster.json"
    if not state.exists():
        return [f"http://{a}/metrics" for a in run_verb(announced(conn))]
    try:
        addresses = json.loads(state.read_text()).get("metrics", {})
    except (OSError, ValueError) as err:
        raise CliError(f"{state}: cannot read the dev cluster's metrics addresses ({err}); "
                       "give each component's metrics address with --metrics HOST:PORT", USAGE) from None
    return [f"http://{a}/metrics" for _, a in sorted(addresses.items())]


async def announced(conn: Connection) -> list[str]:
    """The metrics addresses the cluster announces: each agent's in its Node's status, each server's,
    controller-manager's and gateway's under its lease."""
    async with conn.client() as c:
        members = await c.members()
        nodes, _ = await c.list(Node)
    found = {m.metrics for group in members.values() for m in group if m.metrics}
    found |= {n.status.agentMetrics for n in nodes if n.status.agentMetrics}
    if not found:
        raise CliError("the cluster announces no metrics address (no component serves /metrics); "
                       "give each component's metrics address with --metrics HOST:PORT", USAGE)
    return sorted(found)


async def scrape(session: aiohttp.ClientSession, urls: list[str]) -> tuple[Scrape, list[str]]:
    """Every target's samples in one Scrape, and the targets that did not answer."""
    async def one(url: str) -> str | None:
        try:
            async with session.get(url) as r:
                return await r.text() if r.status == 200 else None
        except (aiohttp.ClientError, asyncio.TimeoutError):
            return None
    texts = await asyncio.gather(*(one(u) for u in urls))
    s = Scrape(time.monotonic())
    for text in texts:
        if text is not None:
            s.add(text)
    return s, [u for u, t in zip(urls, texts, strict=True) if t is None]


def plain(v: View, missing: list[str]) -> str:
    parts = []
    for title, headers, rows in (("MODELS", MODEL_HEADERS, v.models), ("REPLICAS", REPLICA_HEADERS, v.replicas),
                                 ("NODES", NODE_HEADERS, v.nodes)):
        parts.append(f"{title}\n{format_table(headers, rows)}")
    if missing:
        parts.append("not answering: " + ", ".join(missing))
    return "\n\n".join(parts)


def rich(v: View, missing: list[str], interval: float) -> Group:
    items: list[RenderableType] = [Text(f"llmgw top: rates over {interval:g}s; Ctrl-C quits", style="dim")]
    for title, headers, rows in (("Models", MODEL_HEADERS, v.models), ("Replicas", REPLICA_HEADERS, v.replicas),
                                 ("Nodes", NODE_HEADERS, v.nodes)):
        items += [Text(""), Text(title, style="bold"), rich_table(headers, rows)]
    if missing:
        items += [Text(""), Text("not answering: " + ", ".join(missing), style="yellow")]
    return Group(*items)


async def run(urls: list[str], interval: float, once: bool) -> None:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=max(interval, 3.0))) as session:
        before, _ = await scrape(session, urls)
        await asyncio.sleep(interval)
        after, missing = await scrape(session, urls)
        if once:
            click.echo(plain(view(before, after), missing))
            return
        with Live(rich(view(before, after), missing, interval), auto_refresh=False) as live:
            while True:
                await asyncio.sleep(interval)
                before, (after, missing) = after, await scrape(session, urls)
                live.update(rich(view(before, after), missing, interval), refresh=True)


@click.command()
@click.option("--metrics", "metrics", multiple=True, metavar="HOST:PORT",
              help="A component's metrics address (a gateway's --listen, the controller-manager's and the "
                   "agents' --metrics-listen); repeatable. Default: every component of the dev cluster in --dir, "
                   "else every one the cluster announces (Nodes' status, the components' leases), read through "
                   "the API with the config file (LLMGW_CONFIG).")
@click.option("--dir", "directory", default=DEFAULT_DIR, show_default=True,
              help="A `llmgw dev up` cluster's directory, whose cluster.json lists its metrics addresses; "
                   "where it has none, the cluster's are asked of the API.")
@click.option("--interval", type=click.FloatRange(min=0.1), default=2.0, show_default=True,
              help="Seconds between scrapes: rates and latencies are over this window.")
@click.option("--once", is_flag=True, help="Scrape twice, --interval apart, print the tables and exit.")
@connection_options
def top(conn: Connection, metrics: tuple[str, ...], directory: str, interval: float, once: bool) -> None:
    """Models, replicas and nodes with their live request rate, latency, queues and GPUs."""
    urls = targets(metrics, directory, conn)
    try:
        asyncio.run(run(urls, interval, once))
    except KeyboardInterrupt:
        pass

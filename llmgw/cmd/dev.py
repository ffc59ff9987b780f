"""`llmgw dev up|down`: a whole local cluster on loopback, for trying llmgw and for tests."""
from __future__ import annotations

import asyncio
import os
import shutil
import signal
import sys
import threading
import time
from pathlib import Path

import aiohttp
import click
from rich.console import Console
from rich.live import Live
from rich.table import Table

from llmgw.api import ApiKey, ApiKeySpec, Model, Node, ObjectMeta, Replica, condition_true, load_path
from llmgw.api.secrets import hash_secret, new_secret
from llmgw.client import ApiError, Client, ClientConfig
from llmgw.dev.cluster import NETNS_FILE, REPO, LocalCluster, NodePlan, PortTaken, default_nodes
from llmgw.dev.cluster import down as cluster_down
from llmgw.dev.netns import Network, Unavailable, remove_saved
from llmgw.engines.engine import executable_name, executables

DEFAULT_DIR = ".llmgw-dev"
FIRST_KEY = "dev"   # the ApiKey `dev up --api-keys` makes (every model, no limits); a new secret each run
SIM_EXAMPLES = sorted((REPO / "examples" / "models").glob("sim-*.yaml"))
console = Console(stderr=True)


@click.group()
def dev() -> None:
    """A local cluster for trying llmgw: everything on loopback, fake GPUs, sim engines."""


@dev.command()
@click.option("--nodes", "node_count", type=click.IntRange(1, 200), default=4, show_default=True,
              help="Agents to start (8 fake GPUs each; fabrics ib-a, ib-a, ib-b, island, repeating).")
@click.option("--dir", "directory", type=click.Path(file_okay=False), default=DEFAULT_DIR, show_default=True,
              help="Where all state goes (CA, etcd data, logs, agents' state).")
@click.option("--gateway-port", type=click.IntRange(1, 65535), default=8000, show_default=True,
              help="Port of the gateway on 127.0.0.1 (another cluster on this machine needs another).")
@click.option("--servers", "server_count", type=click.IntRange(1, 9), default=1, show_default=True,
              help="API servers over the one etcd; every agent, the gateway and the admin's config are given "
                   "them all, and move to the next when one goes away.")
@click.option("--no-examples", is_flag=True, help="Do not apply the sim examples.")
@click.option("--timeout", type=float, default=180.0, show_default=True,
              help="Seconds to wait for the examples to become Ready before giving up on showing progress.")
@click.option("--engine", "engines", multiple=True, metavar="NAME[=PATH]",
              help="Give every agent a real engine: llamacpp (or llama-server), vllm, ray, or sglang=PYTHON; "
                   "without =PATH the program is looked for on PATH. Repeatable.")
@click.option("--netns", is_flag=True,
              help="Run each node (its agent and engines) in a network namespace of its own, reached over a "
                   "veth pair from a bridge with a private /24 (root, iproute2); a partition is then one "
                   "nftables rule on the node's eth0 (`ip netns exec NS nft ...`). Removed when the cluster stops.")
@click.option("--api-keys", is_flag=True,
              help=f"Run the gateway with --watch-api-keys: a request needs an API key (`llmgw create apikey`); "
                   f"a first one, {FIRST_KEY!r} (every model, no limits), is made and printed.")
def up(node_count: int, directory: str, gateway_port: int, server_count: int, no_examples: bool, timeout: float,
       engines: tuple[str, ...], netns: bool, api_keys: bool) -> None:
    """Start etcd, the server, the controller-manager, the gateway and N agents; Ctrl-C stops them.

    Exit codes: 0 after a clean Ctrl-C or `llmgw dev down`; 1 when a component failed.
    """
    cluster_dir = Path(directory).resolve()
    if (cluster_dir / "cluster.json").exists() and cluster_down(cluster_dir):
        console.print(f"stopped what an earlier `dev up` left running in {cluster_dir}")
    if (cluster_dir / "etcd").exists():
        console.print(f"reusing the state an earlier run left in {cluster_dir}: replicas whose engines stopped "
                      f"with it are rebuilt first (for a fresh start, remove the directory)")
    plans = default_nodes(node_count)
    cluster = LocalCluster(cluster_dir, plans, gateway_port=gateway_port, servers=server_count,
                           engines=engine_paths(engines), gateway_args=["--watch-api-keys"] if api_keys else [])
    net = _namespaces(plans, cluster_dir) if netns else None
    if net is not None:
        cluster.use_network(net)
    stop = _stop_on_signals()
    try:
        with console.status("starting etcd, server, controller-manager, gateway and agents..."):
            cluster.start()
        console.print(f"[green]cluster up[/] in {cluster_dir} ({node_count} nodes)")
        secret = asyncio.run(_first_key(cluster)) if api_keys else None
        if not no_examples:
            asyncio.run(_apply_and_watch(cluster, timeout, stop, secret))
        if not stop.is_set():
            _print_howto(cluster, secret)
        while not stop.is_set():
            cluster.check_alive()
            time.sleep(0.5)
    except PortTaken as err:
        console.print(f"[red]error:[/] {err}: choose another with --gateway-port", highlight=False, soft_wrap=True)
        sys.exit(1)
    except (RuntimeError, TimeoutError) as err:
        console.print(f"[red]error:[/] {err}")
        sys.exit(1)
    finally:
        with console.status("stopping everything..."):
            cluster.stop()
            if net is not None:
                remove_saved(cluster_dir / NETNS_FILE)
    console.print("stopped; nothing left running")


@dev.command()
@click.option("--dir", "directory", type=click.Path(file_okay=False), default=DEFAULT_DIR, show_default=True)
def down(directory: str) -> None:
    """Stop every process a `dev up` in DIR started (engines included); a `dev up` still
    running is asked to stop first, and says so where it runs."""
    n = cluster_down(Path(directory))
    click.echo(f"stopped {n} process(es)" if n else "nothing was running")


def _namespaces(plans: list[NodePlan], cluster_dir: Path) -> Network:
    """A namespace per node, written down for `dev down`."""
    try:
        net = Network.create([p.name for p in plans])
    except Unavailable as why:
        console.print(f"[red]error:[/] --netns: {why}", highlight=False, soft_wrap=True)
        sys.exit(1)
    cluster_dir.mkdir(parents=True, exist_ok=True)
    net.save(cluster_dir / NETNS_FILE)
    console.print(f"each node in a network namespace of its own: {', '.join(sorted(net.netns.values()))} "
                  f"(bridge {net.bridge}, {net.prefix}.0/24)", highlight=False, soft_wrap=True)
    return net


def engine_paths(values: tuple[str, ...]) -> dict[str, str]:
    """--engine NAME[=PATH] values as the agent's --engine NAME=PATH pairs, each path checked."""
    out = {}
    for value in values:
        name, _, path = value.partition("=")
        try:
            name = executable_name(name)
        except ValueError as err:
            raise click.BadParameter(str(err), param_hint="--engine") from None
        if not path:
            if not executables()[name].on_path:
                raise click.BadParameter(f"{name} needs =PATH: it is not a program found on PATH",
                                         param_hint="--engine")
            path = shutil.which(name) or ""
            if not path:
                raise click.BadParameter(f"{name} is not on PATH: give --engine {name}=PATH", param_hint="--engine")
        if not os.access(path, os.X_OK) or os.path.isdir(path):
            raise click.BadParameter(f"{name}={path}: not an executable file", param_hint="--engine")
        out[name] = str(Path(path).resolve())
    return out


def _stop_on_signals() -> threading.Event:
    flag = threading.Event()

    def handler(signum: int, frame: object) -> None:
        if flag.is_set():  # a second Ctrl-C: stop waiting politely
            raise KeyboardInterrupt
        flag.set()
    signal.signal(signal.SIGINT, handler)
    signal.signal(signal.SIGTERM, handler)
    return flag


async def _first_key(cluster: LocalCluster) -> str:
    """The first ApiKey's secret: the key made, or on a directory an earlier run left, given a new secret."""
    secret = new_secret(FIRST_KEY)
    key = ApiKey(metadata=ObjectMeta(name=FIRST_KEY),
                 spec=ApiKeySpec(owner="dev-admin", secretHash=hash_secret(secret)))
    async with Client.from_config(ClientConfig.load(cluster.admin_config)) as client:
        await client.apply(key)
    return secret


async def _apply_and_watch(cluster: LocalCluster, timeout: float, stop: threading.Event, secret: str | None) -> None:
    async with Client.from_config(ClientConfig.load(cluster.admin_config)) as client:
        # Apply once every agent has registered, so the first placements see all nodes.
        deadline = time.monotonic() + timeout
        with console.status(f"waiting for {len(cluster.nodes)} nodes to register..."):
            while len(await _ready_nodes(client)) < len(cluster.nodes):
                if stop.is_set():
                    return
                cluster.check_alive()
                if time.monotonic() > deadline:
                    raise TimeoutError(f"not every node registered within {timeout:.0f}s; "
                                       f"see the agent logs in {cluster.dir / 'logs'}")
                await asyncio.sleep(0.2)
        names = []
        for path in SIM_EXAMPLES:
            for _, obj in load_path(path):
                result, _ = await client.apply(obj)
                names.append(obj.name)
                console.print(f"{obj.kind.lower()}/{obj.name} {result} ({path.relative_to(REPO)})")
        deadline = time.monotonic() + timeout
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as http:
            with Live(console=console, refresh_per_second=4) as live:
                while True:
                    if stop.is_set():
                        return
                    cluster.check_alive()
                    table, ready = await _progress(client, names)
                    # Status alone can be stale: on a directory an earlier run left, replicas still say
                    # Ready while their engines are gone. Done means what the user does next works.
                    if ready:
                        ready = await _gateway_answers(http, cluster.gateway_url, names, table, secret)
                    live.update(table)
                    if ready:
                        break
                    if time.monotonic() > deadline:
                        console.print(f"[yellow]not Ready after {timeout:.0f}s[/]: see `llmgw describe model NAME` "
                                      f"and the logs in {cluster.dir / 'logs'}; the cluster keeps running")
                        return
                    await asyncio.sleep(0.5)
        console.print("\n[green]all example models Ready and answering through the gateway[/]")


async def _ready_nodes(client: Client) -> list[str]:
    try:
        nodes, _ = await client.list(Node)
    except ApiError:
        return []
    return [n.name for n in nodes if condition_true(n.status.conditions, "Ready")]


async def _progress(client: Client, names: list[str]) -> tuple[Table, bool]:
    table = Table("MODEL", "READY", "REPLICAS (phase@nodes)")
    all_ready = True
    try:
        models = {m.name: m for m in (await client.list(Model))[0]}
        replicas = (await client.list(Replica))[0]
    except ApiError as err:
        table.add_row("?", "?", str(err))
        return table, False
    for name in names:
        m = models.get(name)
        if m is None:
            table.add_row(name, "-", "not found")
            all_ready = False
            continue
        mine = [r for r in replicas if r.spec.model == name]
        desc = ", ".join(
            f"{r.status.phase}@{'+'.join(p.node for p in r.spec.placement) or '-'}" for r in mine) or "-"
        ready = m.status.readyReplicas
        all_ready &= ready >= m.wanted_replicas
        table.add_row(name, f"{ready}/{m.wanted_replicas}", desc)
    return table, all_ready


async def _gateway_answers(http: aiohttp.ClientSession, gateway: str, names: list[str], table: Table,
                           secret: str | None) -> bool:
    """One short completion per model through the gateway (with the first key, `secret`, where keys
    are enforced); a failure is added to the progress table."""
    headers = {"authorization": f"Bearer {secret}"} if secret else {}
    for name in names:
        body = {"model": name, "messages": [{"role": "user", "content": "ping"}], "max_tokens": 1}
        try:
            async with http.post(f"{gateway}/v1/chat/completions", json=body, headers=headers) as resp:
                if resp.status == 200:
                    continue
                why = f"{resp.status} {(await resp.text())[:120]}"
        except (aiohttp.ClientError, asyncio.TimeoutError) as err:
            why = repr(err)
        table.add_row(name, "-", f"gateway: {why}")
        return False
    return True


def _print_howto(c: LocalCluster, secret: str | None) -> None:
    venv_bin = Path(sys.executable).parent
    llmgw = venv_bin / "llmgw"
    auth = f" -H 'authorization: Bearer {secret}'" if secret else ""
    api_key = secret or "none"
    keys = "" if secret is None else f"""
The gateway enforces API keys: a request without one is refused 401. This one is the key
{FIRST_KEY!r} (every model, no limits); a key of one model and 3 requests a minute:

  {llmgw} create apikey team-a --owner team-a@example.com --model small --rpm 3
"""
    click.echo(f"""
Your cluster (state in {c.dir}, logs in {c.dir / 'logs'}):

  export LLMGW_CONFIG={c.admin_config}   # the API servers: {', '.join(c.server_urls)}
  {llmgw} get nodes
  {llmgw} get models -o wide

Send a request through the gateway ({c.gateway_url}):

  curl -s {c.gateway_url}/v1/chat/completions -H 'content-type: application/json'{auth} \\
    -d '{{"model": "small", "messages": [{{"role": "user", "content": "hello"}}]}}'

  {venv_bin / 'python'} -c 'import openai; c = openai.OpenAI(base_url="{c.gateway_url}/v1", api_key="{api_key}"); \\
print(c.chat.completions.create(model="large",
      messages=[{{"role": "user", "content": "hi"}}]).choices[0].message.content)'
{keys}
Watch status in etcd (TLS; the admin's etcd client certificate):

  . {c.dir / 'etcd' / 'etcdctl.env'}; etcdctl watch --prefix /llmgw/status/

Metrics: every component's /metrics is in {c.dir / 'cluster.json'}; a Prometheus scrapes them all with

  prometheus --config.file {c.dir / 'prometheus.yml'}     (docs/metrics.md; dashboards in deploy/grafana/)

Ctrl-C here (or `{llmgw} dev down --dir {c.dir}`) stops everything.
""")

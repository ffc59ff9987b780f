"""`llmgw agent`: the node agent's command line (flags override the config file)."""
from __future__ import annotations

import asyncio
import logging
import sys
from typing import TYPE_CHECKING, Any

import click
import yaml

from llmgw import aio
from llmgw.agent.config import ConfigError, load_config
from llmgw.api.errors import VersionSkew
from llmgw.api.fabrics import FabricError
from llmgw.cmd.logs import log_options, setup_logging

if TYPE_CHECKING:
    from llmgw.agent.agent import Agent


def _pairs(values: tuple[str, ...], flag: str) -> dict[str, str]:
    out = {}
    for v in values:
        key, sep, val = v.partition("=")
        if not sep or not key:
            raise click.BadParameter(f"{v!r}: expected NAME=VALUE", param_hint=flag)
        out[key] = val
    return out


@click.command("agent")
@click.option("--config", "config_path", type=click.Path(dir_okay=False),
              help="Agent configuration file (see examples/agent.yaml); flags override it.")
@click.option("--node", help="This node's name (default: the host name).")
@click.option("--server", "server", multiple=True,
              help="llmgw server URL, e.g. https://control:7443; repeatable or comma-separated: every API "
                   "server, the agent moves to the next when one goes away.")
@click.option("--ca", help="CA certificate that signed the server's certificate.")
@click.option("--cert", help="This node's certificate (O=llmgw:nodes, CN=<node>).")
@click.option("--key", help="This node's private key.")
@click.option("--fabric", "fabrics", multiple=True, metavar="NAME[:ADAPTER,ADAPTER]",
              help="A fabric this node is cabled to; repeatable. NAME alone claims the first two "
                   "ACTIVE InfiniBand ports no other fabric names. None: the node is an island.")
@click.option("--nvidia-smi", help="nvidia-smi to run (default /usr/bin/nvidia-smi, then PATH).")
@click.option("--ib-root", help="InfiniBand sysfs root (default /sys/class/infiniband).")
@click.option("--engine", "engines", multiple=True, metavar="NAME=PATH",
              help="Engine executable: vllm, ray, sglang or llama-server; repeatable.")
@click.option("--state-dir", help="Where engine records and logs live (default /var/lib/llmgw/agent).")
@click.option("--weights-dir", help="The weights cache: models pulled from hf:// and http(s):// sources "
              "(default <state-dir>/weights).")
@click.option("--weights-cache-size", metavar="SIZE",
              help="The cache's budget, e.g. 500Gi (default: what its disk holds); unused models are evicted.")
@click.option("--hub-endpoint", help="The Hugging Face Hub of hf:// sources, or its mirror "
              "(default: HF_ENDPOINT, else https://huggingface.co).")
@click.option("--hub-token-file", help="A file holding the hub's token (default: HF_TOKEN, if set).")
@click.option("--port-range", help="Ports for engines, FIRST-LAST (default 30000-32767).")
@click.option("--advertise-address", help="Address engines bind and peers reach (default: the route to the server).")
@click.option("--drain-delay", help="Wait between a shard's deletion and SIGTERM (default 2s).")
@click.option("--stop-grace-period", help="SIGTERM to SIGKILL (default 30s).")
@click.option("--heartbeat-interval", help="Between heartbeats (default 5s).")
@click.option("--liveness-timeout", help="How long a Ready shard's health probe may keep failing before its engine "
              "is stopped and the shard Failed, so the replica is rebuilt (default 30s; 0: never).")
@click.option("--gpu-memory-interval", help="Between reads of each GPU's free memory, which placement compares "
              "with a model's estimate (default 10s; 0: only at rediscovery, every 60s).")
@click.option("--gpu-memory-step", type=int, metavar="MIB", help="Report a GPU's free memory again only when it "
              "moved by this much since it was reported (default 1024).")
@click.option("--metrics-listen", metavar="HOST:PORT",
              help="Serve GET /metrics here: the node's shards by phase and its engines' own series, "
                   "labelled with model, replica, node, rank and engine (default: off).")
@click.option("--logs-listen", metavar="HOST:PORT",
              help="Serve this node's engine logs to the API server, its weights cache read-only to "
                   "the other nodes, and LoRA adapter loads to the gateways (a cold adapter loaded at once), "
                   "here, over TLS with the node's certificate (`llmgw logs`); advertised "
                   "in the Node's status.agentEndpoint with --advertise-address (port 0: any free port; "
                   "default: off).")
@click.option("--weights-peers/--no-weights-peers", default=None,
              help="Fetch weights from the nodes that hold or are pulling them before the origin "
                   "(default: on, with --logs-listen).")
@click.option("--renew-fraction", type=float, help="Renew this node's certificate at this fraction of its "
              "lifetime (default 0.667; 0: never), through the API server's signer, without a restart.")
@click.option("--label", "labels", multiple=True, metavar="KEY=VALUE", help="Label for a new Node; repeatable.")
@click.option("--discover", "discover_only", is_flag=True,
              help="Print the Node status discovery finds, then exit (no server needed).")
@log_options
def agent(config_path: str | None, discover_only: bool, log_level: str, log_format: str, engines: tuple[str, ...],
          labels: tuple[str, ...], **flags: Any) -> None:
    """Run the node agent: register this node, heartbeat, run and supervise its shards' engines.

    Engines run in their own sessions and outlive the agent; a restarted agent
    adopts them (see deploy/systemd/llmgw-agent.service, KillMode=process).
    """
    setup_logging(log_level, log_format)
    overrides = dict(flags)
    overrides["engines"] = _pairs(engines, "--engine") or None
    overrides["labels"] = _pairs(labels, "--label") or None
    overrides["fabrics"] = list(overrides.pop("fabrics")) or None
    try:
        config = load_config(config_path, overrides)
        from llmgw.agent.agent import Agent
        from llmgw.agent.facts import node_status
        runner = Agent(config)
        facts = runner.discover()
        if discover_only:
            status = node_status(facts, config).model_dump(mode="json", exclude={"observedGeneration", "drain"})
            click.echo(yaml.safe_dump({"node": runner.node, "status": status}, sort_keys=False), nl=False)
            return
        config.require_connection()
    except (ConfigError, FabricError, OSError) as err:
        raise click.ClickException(str(err)) from None
    sys.exit(_run(runner))


def _run(runner: "Agent") -> int:
    try:
        stopped = asyncio.run(aio.until_signal(runner.run()))
    except (asyncio.CancelledError, KeyboardInterrupt):
        stopped = True
    except (OSError, VersionSkew) as err:   # a refusal of its version: one line naming both, no retry cures it
        click.echo(f"Error: {err}", err=True)
        return 1
    if stopped:
        logging.getLogger("llmgw.agent").info("agent stopped; engines keep running")
    return 0

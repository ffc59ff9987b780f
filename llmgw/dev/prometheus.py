"""A Prometheus scrape config for a local cluster: one job per kind of component.

`llmgw dev up` writes it as <dir>/prometheus.yml, with every component's metrics
address, so `prometheus --config.file=<dir>/prometheus.yml` scrapes the whole cluster
(docs/metrics.md, "Prometheus against a local cluster"). The jobs are those of the
fleet's config, deploy/prometheus/prometheus.yml.
"""
from __future__ import annotations

import yaml

# job -> the prefix of the components it scrapes (LocalCluster's process names)
JOBS = {
    "llmgw-server": "server",
    "llmgw-controller-manager": "controller-manager",
    "llmgw-gateways": "gateway",
    "llmgw-agents": "agent-",
    "etcd": "etcd-",
}


def jobs(addresses: dict[str, str]) -> dict[str, list[str]]:
    """Each job's targets, from component name -> its metrics address."""
    return {job: sorted(addr for name, addr in addresses.items() if name.startswith(prefix))
            for job, prefix in JOBS.items()}


def scrape_config(addresses: dict[str, str], interval: str = "5s") -> str:
    """prometheus.yml scraping every component in `addresses` every `interval`."""
    doc = {
        "global": {"scrape_interval": interval, "evaluation_interval": interval},
        "scrape_configs": [{"job_name": job, "static_configs": [{"targets": targets}]}
                           for job, targets in jobs(addresses).items() if targets],
    }
    return "# Written by `llmgw dev up`: the local cluster's components (llmgw/dev/prometheus.py).\n" + \
        yaml.safe_dump(doc, sort_keys=False)

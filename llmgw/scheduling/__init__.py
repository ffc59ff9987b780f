"""Pure placement logic for the scheduler: no etcd, no asyncio.

- `request.Request`: what one replica needs (nodes, GPUs per node, engines, selector).
- `ledger.Ledger`: the cluster as the scheduler sees it, with incremental
  per-node accounting of free GPUs, used ports and replicas per model.
- `placer.place()`: pick nodes and GPU indices for a request, or explain why not.
"""
from llmgw.scheduling.ledger import Ledger, NodeInfo
from llmgw.scheduling.placer import Fit, Unfit, budget, describe, place
from llmgw.scheduling.request import Request, request_for

__all__ = ["Ledger", "NodeInfo", "Fit", "Unfit", "budget", "describe", "place", "Request", "request_for"]

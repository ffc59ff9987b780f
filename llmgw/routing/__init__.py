"""Routing policies: how the gateway picks one of a model's replicas (llmgw.routing.policy).

Importing this package registers the built-in policies; a new one is a module
beside them that defines a class and registers it, imported here.
"""
from llmgw.routing import least_outstanding, precise_prefix, prefix_hash, prefix_score  # noqa: F401 - they register
from llmgw.routing.policy import DEFAULT, POLICIES, RoutingParams, RoutingPolicy, check_name, describe, register

__all__ = ["DEFAULT", "POLICIES", "RoutingParams", "RoutingPolicy", "check_name", "describe", "register"]

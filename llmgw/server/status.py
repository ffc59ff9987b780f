"""The body of every API error: a Kubernetes-style Status (docs/contracts.md, "Errors")."""
from __future__ import annotations


def status_body(code: int, reason: str, message: str, **details) -> dict:
    body = {"apiVersion": "llmgw.io/v1", "kind": "Status", "status": "Failure",
            "code": code, "reason": reason, "message": message}
    if details:
        body["details"] = details
    return body

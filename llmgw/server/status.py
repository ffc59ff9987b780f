"""The body of every API error: a Kubernetes-style Status (docs/contracts.md, "Errors")."""
from __future__ import annotations

from typing import Any


def status_body(code: int, reason: str, message: str, **details: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"apiVersion": "llmgw.io/v1", "kind": "Status", "status": "Failure",
            "code": code, "reason": reason, "message": message}
    if details:
        body["details"] = details
    return body

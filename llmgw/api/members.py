"""What a server, a controller-manager or a gateway announces of itself: its llmgw version and
where it serves (docs/contracts.md, "Members").

Servers and controller-managers write theirs under ``/llmgw/members/<component>/<name>``, bound to a
lease of their own (llmgw/store/members.py): one that stops is gone when its lease expires. A
gateway's is its demand report's ``version`` and ``metrics`` (llmgw/api/demand.py), under the
lease of that report. ``GET /members`` lists them all, ``GET /versions`` their versions; ``llmgw
top`` reads the metrics addresses.
"""
from __future__ import annotations

import socket
from typing import Annotated, Literal

from pydantic import Field

from llmgw.api.meta import Strict

Component = Literal["server", "controller-manager"]
# A component's name as its key holds it: the server's HOST:PORT, the controller-manager's identity.
MEMBER_NAME = r"^[A-Za-z0-9][A-Za-z0-9_.:\[\]-]{0,252}$"
MemberName = Annotated[str, Field(pattern=MEMBER_NAME)]
# HOST:PORT of GET /metrics (or an https URL, a server's)
Address = Annotated[str, Field(min_length=1, max_length=300)]


def advertised(listen: str, address: str | None = None) -> str:
    """The HOST:PORT others reach a listener on: a wildcard host (0.0.0.0, ::, none) is `address`,
    else this machine's name; an IPv6 address in brackets."""
    host, _, port = listen.rpartition(":")
    host = host.strip("[]")
    if host in ("", "0.0.0.0", "::"):
        host = address or socket.gethostname()
    return f"{f'[{host}]' if ':' in host else host}:{port}"


class Member(Strict):
    name: MemberName
    version: str | None = None      # its llmgw version (none: a component older than announcements)
    metrics: Address | None = None  # HOST:PORT of its GET /metrics; None: it serves none
    url: Address | None = None      # a server's API URL (https://HOST:PORT)

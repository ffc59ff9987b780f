"""An API key's usage as `llmgw describe apikey` shows it, and its last use as `get apikeys`' LAST-USE:
summed over the live gateways by the server (llmgw/api/usage.py)."""
from __future__ import annotations

from datetime import datetime

from llmgw.api.usage import KeyUsage, Tally
from llmgw.printers.table import NONE, human_age, section

WINDOWS = (("1m", "lastMinute"), ("1h", "lastHour"), ("total", "total"))


def last_use(usage: KeyUsage | None, now: datetime | None = None) -> str:
    """`get apikeys`' LAST-USE: how long ago (`12s`, `3h`), or <none> for a key no live gateway has seen used."""
    if usage is None or usage.lastUsed is None:
        return NONE
    return human_age(usage.lastUsed, now)


def _cells(t: Tally) -> list[str]:
    return [str(t.requests), str(t.promptTokens), str(t.completionTokens), str(t.rateLimited)]


def usage_lines(usage: KeyUsage, gateways: int, now: datetime | None = None) -> list[str]:
    """`Last use:` and a row per model and window (the last minute, hour, and since each gateway started)."""
    used = usage.lastUsed
    lines = [f"Last use:     {'never' if used is None else f'{used.isoformat()} ({human_age(used, now)} ago)'}"]
    rows = [[model, label, *_cells(getattr(m, field))]
            for model, m in sorted(usage.models.items()) for label, field in WINDOWS]
    plural = "" if gateways == 1 else "s"
    return lines + section(f"Usage (summed over {gateways} live gateway{plural}; total: since each started)",
                           ["MODEL", "WINDOW", "REQUESTS", "PROMPT-TOKENS", "COMPLETION-TOKENS", "RATE-LIMITED"],
                           rows)

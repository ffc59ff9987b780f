"""An ApiKey's table (`llmgw get apikeys`: never the secret, nor its hash) and what `describe`
shows beside it: its usage over the live gateways."""
from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from llmgw.api import ApiKey
from llmgw.api.usage import KeyUsage
from llmgw.printers.kinds.printer import Beside, KindPrinter, Reader, register
from llmgw.printers.table import NONE, human_age, join
from llmgw.printers.usage import last_use, usage_lines


def key_scope(k: ApiKey) -> str:
    """The models a key may call: names, then `label=value` selectors; `*` for every model."""
    if k.spec.any_model:
        return "*"
    return join([*k.spec.models, *(f"{n}={v}" for n, v in sorted(k.spec.modelSelector.items()))])


def key_limits(k: ApiKey) -> str:
    lim = k.spec.limits
    parts = [f"{what}={n}" for what, n in (("rpm", lim.requestsPerMinute), ("tpm", lim.tokensPerMinute),
                                           ("concurrency", lim.concurrentRequests)) if n is not None]
    return join(parts)


@register(ApiKey)
class ApiKeyPrinter(KindPrinter[ApiKey]):
    headers = ["NAME", "OWNER", "MODELS", "LIMITS", "PRIORITY", "EXPIRES", "LAST-USE", "AGE"]
    reads_usage = True   # LAST-USE

    def rows(self, objects: Sequence[ApiKey], beside: Beside, now: datetime | None) -> list[list[str]]:
        return [[k.name, k.spec.owner, key_scope(k), key_limits(k), k.spec.priorityClass,
                 k.spec.expires.isoformat().replace("+00:00", "Z") if k.spec.expires is not None else NONE,
                 last_use(beside.usage.get(k.name), now), human_age(k.metadata.creationTimestamp, now)]
                for k in objects]

    async def related(self, reader: Reader, obj: ApiKey) -> list[str]:
        got = await reader.apikey_usage(obj.name)
        return usage_lines(KeyUsage.model_validate(got["usage"]), got["gateways"])

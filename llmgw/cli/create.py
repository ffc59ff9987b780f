"""`llmgw create apikey`: a new ApiKey, its secret printed once (only its salted hash is stored)."""
from __future__ import annotations

import re
from datetime import datetime, timedelta, timezone

import click
from pydantic import ValidationError

from llmgw.api import ApiKey
from llmgw.api.manifests import describe_validation_error
from llmgw.api.meta import now
from llmgw.api.secrets import hash_secret, new_secret
from llmgw.cli.connect import Connection, connection_options, run, usage_error
from llmgw.cli.errors import EXIT_CODES_HELP
from llmgw.cli.get import warn_unless_keys_enforced

_DURATION = re.compile(r"^(\d+)([smhd])$")
_UNIT = {"s": "seconds", "m": "minutes", "h": "hours", "d": "days"}


def expiry(value: str, at: datetime) -> datetime:
    """`--expires`: a duration from `at` (90d, 12h, 30m, 45s) or an ISO 8601 time (UTC if no zone)."""
    m = _DURATION.match(value)
    if m:
        return at + timedelta(**{_UNIT[m.group(2)]: int(m.group(1))})
    try:
        when = datetime.fromisoformat(value)
    except ValueError:
        raise usage_error(f"--expires {value!r}: expected a duration (90d, 12h, 30m, 45s) or an ISO 8601 "
                          "time (2027-01-31 or 2027-01-31T12:00:00Z)") from None
    return when if when.tzinfo is not None else when.replace(tzinfo=timezone.utc)


def build_key(name: str, secret: str, *, owner: str, models: tuple[str, ...], selector: tuple[str, ...],
              expires: datetime | None, rpm: int | None, tpm: int | None, concurrency: int | None,
              priority: str) -> ApiKey:
    """The ApiKey object for `secret` (hashed here: the secret never leaves this process)."""
    labels = {}
    for term in selector:
        label, sep, value = term.partition("=")
        if not sep:
            raise usage_error(f"--model-selector {term!r}: expected LABEL=VALUE")
        labels[label] = value
    doc = {
        "kind": "ApiKey", "metadata": {"name": name},
        "spec": {"owner": owner, "secretHash": hash_secret(secret), "models": list(models),
                 "modelSelector": labels, "expires": expires, "priorityClass": priority,
                 "limits": {k: v for k, v in (("requestsPerMinute", rpm), ("tokensPerMinute", tpm),
                                              ("concurrentRequests", concurrency)) if v is not None}},
    }
    try:
        return ApiKey.model_validate(doc)
    except ValidationError as err:
        raise usage_error("; ".join(describe_validation_error(err))) from None


@click.group()
def create() -> None:
    """Create an object from flags (manifests: `llmgw apply`)."""


@create.command(epilog=EXIT_CODES_HELP)
@click.argument("name")
@click.option("--owner", required=True, help="Who the key is for (a team, a person, a service).")
@click.option("--model", "models", multiple=True, help="A model name or alias the key may call (repeatable); "
              "with neither --model nor --model-selector, every model.")
@click.option("--model-selector", "selector", multiple=True, metavar="LABEL=VALUE",
              help="The key may also call the Models with this label (repeatable: all must match).")
@click.option("--expires", help="When the key stops working: a duration from now (90d, 12h) or an ISO 8601 time.")
@click.option("--rpm", type=click.IntRange(min=1), help="Requests per minute, over all gateways.")
@click.option("--tpm", type=click.IntRange(min=1),
              help="Tokens (prompt and completion, as the engines report them) per minute, over all gateways.")
@click.option("--concurrency", type=click.IntRange(min=1), help="Requests in flight at once, over all gateways.")
@click.option("--priority", type=click.Choice(["critical", "standard", "sheddable"]), default="standard",
              show_default=True, help="Who waits and who is shed first when a model is overloaded.")
@connection_options
def apikey(name: str, owner: str, models: tuple[str, ...], selector: tuple[str, ...], expires: str | None,
           rpm: int | None, tpm: int | None, concurrency: int | None, priority: str, conn: Connection) -> None:
    """Create an API key and print its secret, once: only a salted hash of it is stored.

    Clients send the secret as 'Authorization: Bearer SECRET' (the openai client's api_key).
    """
    secret = new_secret(name)
    key = build_key(name, secret, owner=owner, models=models, selector=selector,
                    expires=expiry(expires, now()) if expires else None,
                    rpm=rpm, tpm=tpm, concurrency=concurrency, priority=priority)

    async def go() -> None:
        async with conn.client() as c:
            await c.create(key)
            click.echo(f"apikey/{name} created; its secret (shown only now):", err=True)
            await warn_unless_keys_enforced(c)

    run(go())
    click.echo(secret)

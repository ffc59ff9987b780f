"""Async client of `llmgw server` (mutual TLS; REST in docs/contracts.md).

    from llmgw.client import Client, ClientConfig, ApiError

    cfg = ClientConfig.load(path=None)   # explicit path > $LLMGW_CONFIG > ~/.config/llmgw/config.yaml
                                         # fields: server, ca, cert, key (ConfigError when unusable)
    async with Client(server_url, ca=..., cert=..., key=...) as c:   # or Client.from_config(cfg)
        # oneshot=True: requests through http.client, aiohttp only once a watch or a log starts (the CLI)
        # an llmgw.api.ObjectClient: kind is a class (Model: typed answers) or a name (plural, singular, "mo")
        obj = await c.get(kind, name, node=None)
        items, rv = await c.list(kind, selector=None, node=None)   # rv: the revision to watch from
        obj = await c.create(obj)                         # AlreadyExists
        obj = await c.update(obj)                         # Conflict when obj.metadata.resourceVersion is stale
        obj = await c.update_status(obj)                  # replaces status
        obj = await c.patch_status(kind, name, {"phase": ...}, node=None)   # top-level merge, conditions by type
        obj = await c.delete(kind, name, node=None)
        result, obj = await c.apply(obj)                  # 'created' | 'configured' | 'unchanged'
        async for ev in c.watch(kind, rv + 1, node=None, selector=None):   # or resource_version=rv: after rv
            ev.type, ev.object, ev.revision               # an llmgw.api.WatchEvent; raises Expired (410): relist,
                                                          # watch from the list's rv
        async for type, obj in c.list_and_watch(kind, node=None, selector=None, synced=False):
            ...                                           # a reflector (llmgw.reflector): relists on 410,
                                                          # re-watches after drops, synthetic DELETED for
                                                          # objects gone across a relist
        c.lister_watcher(kind, node=None, selector=None)  # the same source, for a Reflector of your own
        await c.heartbeat(node, ttl=None); await c.events(kind, name)
        await c.record_event(kind, name, type, reason, message)
        chain = await c.renew_certificate(csr_pem)       # a node's or a component's own identity (llmgw/pki/renewal.py)
        await c.try_certificate(cert, key); c.use_certificate(cert, key)   # new connections present it

Errors (each str() is one actionable line):
    ApiError(code, reason, message, url)      base; subclasses by code: BadRequest 400 (Invalid 422),
        Unauthorized 401 (expired/revoked cert), Forbidden 403 (names the rule; VersionSkew: outside
        the version skew policy, naming both versions), NotFound 404,
        Conflict 409 (AlreadyExists is a Conflict), Expired 410, TooManyRequests 429 (retry_after:
        the seconds the server said to wait), Unavailable 503
    Unreachable(url, why)                     code 0: no HTTP answer (refused, DNS, timeout)
    TLSError(side, why, url)                  code 0: side 'server' = we distrust its certificate,
                                              'client' = it refused ours (or ours cannot be loaded)
"""
from llmgw.client.client import Client, ServerObjects
from llmgw.client.config import ClientConfig, ConfigError, config_path
from llmgw.client.errors import (
    AlreadyExists,
    ApiError,
    BadRequest,
    Conflict,
    Expired,
    Forbidden,
    Invalid,
    NotFound,
    TLSError,
    TooManyRequests,
    Unauthorized,
    Unavailable,
    Unreachable,
    VersionSkew,
)

__all__ = ["Client", "ServerObjects", "ClientConfig", "ConfigError", "config_path", "AlreadyExists", "ApiError",
           "BadRequest", "Conflict", "Expired", "Forbidden", "Invalid", "NotFound", "TLSError", "TooManyRequests",
           "Unauthorized", "Unavailable", "Unreachable", "VersionSkew"]

"""Client errors: each str() is one line a person can act on.

Each is a subclass of the API's error contract (llmgw.api.errors), which the
store's errors share: code written against ObjectClient catches ``NotFound``
from either. Here ``code`` and ``reason`` are what the server answered.
"""
from __future__ import annotations

from llmgw.api import errors as api


class ApiError(api.StatusError):
    """The server answered with an error (or could not be asked at all: code 0). ``streamed``:
    it ended a stream that was open (a watch the server had answered), not one that never began."""

    streamed = False

    def __init__(self, code: int, reason: str, message: str, url: str = ""):
        self.code, self.reason, self.message, self.url = code, reason, message, url
        super().__init__(message)

    def __str__(self) -> str:
        return self.message


class BadRequest(ApiError, api.BadRequest):         # 400: the query or the body is malformed
    pass


class Invalid(BadRequest, api.Invalid):             # 422: the object does not validate
    pass


class Unauthorized(ApiError, api.Unauthorized):     # 401: the certificate is expired, not yet valid or revoked
    pass


class Forbidden(ApiError, api.Forbidden):           # 403: the message names the rule
    pass


class VersionSkew(Forbidden, api.VersionSkew):     # 403 VersionSkew: outside the version skew policy
    pass


class NotFound(ApiError, api.NotFound):             # 404
    pass


class Conflict(ApiError, api.Conflict):             # 409 Conflict (stale resourceVersion) or AlreadyExists
    pass


class AlreadyExists(Conflict, api.AlreadyExists):   # 409 AlreadyExists
    pass


class Expired(ApiError, api.Expired):               # 410: the resourceVersion was compacted; relist, then watch
    pass


class TooManyRequests(ApiError, api.TooManyRequests):   # 429: retry_after, the seconds the server said to wait
    pass


class Unavailable(ApiError, api.Unavailable):       # 503: the server cannot reach etcd
    pass


class Unreachable(ApiError, api.Unavailable):
    """No HTTP answer: connection refused, DNS, timeout."""

    def __init__(self, url: str, why: str):
        super().__init__(0, "Unreachable", f"cannot reach the llmgw server at {url}: {why}", url)


class TLSError(ApiError):
    """The TLS handshake failed. side='server': this client does not trust the server's
    certificate; side='client': the server refused this client's certificate (or it cannot be loaded)."""

    def __init__(self, side: str, why: str, url: str = ""):
        self.side, self.why = side, why
        where = f" with {url}" if url else ""
        whose = "the server's certificate" if side == "server" else "this client's certificate"
        super().__init__(0, "TLSError", f"TLS failed{where}: {whose}: {why}", url)


_BY_CODE = {400: BadRequest, 401: Unauthorized, 403: Forbidden, 404: NotFound, 409: Conflict,
            410: Expired, 422: Invalid, 429: TooManyRequests, 503: Unavailable}
_BY_REASON = {(409, "AlreadyExists"): AlreadyExists, (403, "VersionSkew"): VersionSkew}


def error_for(code: int, reason: str, message: str, url: str, details: object = None) -> ApiError:
    cls = _BY_REASON.get((code, reason)) or _BY_CODE.get(code, ApiError)
    err = cls(code, reason, message, url)
    if isinstance(err, TooManyRequests) and isinstance(details, dict):
        try:
            err.retry_after = float(details.get("retryAfterSeconds") or 0)
        except (TypeError, ValueError):
            pass   # a server's answer without a number: no wait said
    return err

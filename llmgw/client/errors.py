"""Client errors: each str() is one line a person can act on."""
from __future__ import annotations


class ApiError(Exception):
    """The server answered with an error (or could not be asked at all: code 0)."""

    def __init__(self, code: int, reason: str, message: str, url: str = ""):
        self.code, self.reason, self.message, self.url = code, reason, message, url
        super().__init__(message)

    def __str__(self) -> str:
        return self.message


class BadRequest(ApiError):      # 400/422: the server says the object or query is invalid
    pass


class Unauthorized(ApiError):    # 401: the certificate is expired, not yet valid or revoked
    pass


class Forbidden(ApiError):       # 403: the message names the rule
    pass


class NotFound(ApiError):        # 404
    pass


class Conflict(ApiError):        # 409 Conflict (stale resourceVersion) or AlreadyExists
    pass


class AlreadyExists(Conflict):   # 409 AlreadyExists
    pass


class Expired(ApiError):         # 410: the resourceVersion was compacted; relist, then watch from the list's
    pass


class Unavailable(ApiError):     # 503: the server cannot reach etcd
    pass


class Unreachable(ApiError):
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
            410: Expired, 422: BadRequest, 503: Unavailable}


def error_for(code: int, reason: str, message: str, url: str) -> ApiError:
    cls = AlreadyExists if (code == 409 and reason == "AlreadyExists") else _BY_CODE.get(code, ApiError)
    return cls(code, reason, message, url)

"""The one error contract of every ObjectClient, in the spirit of client-go's apierrors.

``llmgw.store`` (etcd) and ``llmgw.client`` (the REST API) raise subclasses of
these, so code written against ``ObjectClient`` catches ``NotFound`` whichever
implementation it was given. Each class carries the HTTP status and the reason
the API server answers it with (docs/contracts.md, "REST"); an implementation's
subclass may add what it knows (the URL asked, the revision compacted).
"""
from __future__ import annotations

import math


class StatusError(Exception):
    """An answer of the API that is not a success: ``code`` (HTTP) and ``reason`` (Kubernetes' Status.reason)."""

    code: int = 500
    reason: str = "InternalError"

    @property
    def details(self) -> dict[str, str]:
        """What the answer's Status carries beside its message (a 403's rule); nothing by default."""
        return {}


class BadRequest(StatusError):
    """The request itself is malformed (a query parameter, a body that is not JSON)."""

    code = 400
    reason = "BadRequest"


class Invalid(BadRequest):
    """The object does not validate; the message names the field paths."""

    code = 422
    reason = "Invalid"


class Unauthorized(StatusError):
    """No identity: the client certificate is missing, expired, not yet valid or revoked."""

    code = 401
    reason = "Unauthorized"


class CertificateExpired(Unauthorized):
    reason = "CertificateExpired"


class CertificateNotYetValid(Unauthorized):
    reason = "CertificateNotYetValid"


class CertificateRevoked(Unauthorized):
    reason = "CertificateRevoked"


class Forbidden(StatusError):
    """The identity may not do this; the message names the rule."""

    code = 403
    reason = "Forbidden"


class VersionSkew(Forbidden):
    """The client's version (its X-Llmgw-Version) is outside the version skew policy; the message
    names both versions (llmgw/version.py)."""

    reason = "VersionSkew"


class NotFound(StatusError):
    code = 404
    reason = "NotFound"


class Conflict(StatusError):
    """A write lost a compare-and-swap (a stale resourceVersion, a lost leadership): re-read and retry."""

    code = 409
    reason = "Conflict"


class AlreadyExists(Conflict):
    code = 409
    reason = "AlreadyExists"


class Expired(StatusError):
    """The revision to watch from was compacted: list again, then watch from the list's revision."""

    code = 410
    reason = "Expired"


class RequestEntityTooLarge(StatusError):
    """The request's body is larger than the server reads (llmgw.api.limits.MAX_BODY_BYTES)."""

    code = 413
    reason = "RequestEntityTooLarge"


class UnsupportedMediaType(StatusError):
    """The request's body has a content-type its method does not take."""

    code = 415
    reason = "UnsupportedMediaType"


class TooManyRequests(StatusError):
    """The server takes no more of these now (a rate limit); the same request may succeed after
    ``retry_after`` seconds (the answer's details: retryAfterSeconds)."""

    code = 429
    reason = "TooManyRequests"

    def __init__(self, message: str, retry_after: float = 0.0):
        self.retry_after = retry_after
        super().__init__(message)

    @property
    def details(self) -> dict[str, str]:
        # rounded up: a wait under half a millisecond is still a wait, not "0.000" (come back now)
        return {"retryAfterSeconds": f"{math.ceil(self.retry_after * 1000) / 1000:.3f}"}


class Unavailable(StatusError):
    """The state cannot be reached now (etcd, or the server); the same request may succeed later."""

    code = 503
    reason = "ServiceUnavailable"

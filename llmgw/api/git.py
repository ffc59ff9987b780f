"""A GitSource's fields (llmgw/api/types.py): its repository URL, ref names, path and interval.

Each check returns the value or raises ValueError with a message a person can act on; the
kind's validation puts the field path before it.
"""
from __future__ import annotations

import re
from urllib.parse import urlsplit

SCHEMES = ("https", "ssh", "file")
MIN_INTERVAL_SECONDS = 1
MAX_INTERVAL_SECONDS = 86_400

# A ref name as git check-ref-format reads one, less what git would refuse anyway.
_REF_NAME = re.compile(r"^(?!-)(?!/)(?!.*\.\.)(?!.*//)(?!.*@\{)[A-Za-z0-9._/+-]{1,255}(?<!/)(?<!\.lock)(?<!\.)$")
_COMMIT = re.compile(r"^([0-9a-f]{40}|[0-9a-f]{64})$")
_INTERVAL = re.compile(r"^(?:(\d{1,3})h)?(?:(\d{1,5})m)?(?:(\d{1,6})s)?$")


def check_url(value: str) -> str:
    """https://, ssh:// or file:// with a path; never a password in it (secretRef.file holds one)."""
    parts = urlsplit(value)
    if parts.scheme not in SCHEMES:
        raise ValueError(f"{value!r}: the URL must start with {', '.join(s + '://' for s in SCHEMES)}")
    if parts.scheme != "file" and not parts.hostname:
        raise ValueError(f"{value!r}: no host")
    if not parts.path.strip("/"):
        raise ValueError(f"{value!r}: no repository path")
    if parts.password is not None or (parts.scheme == "https" and parts.username is not None):
        raise ValueError(f"{value!r}: credentials in the URL would be stored in etcd; put them in a file on the "
                         "controller-manager's host and name it in secretRef.file")
    if any(c.isspace() for c in value) or value.startswith("-"):
        raise ValueError(f"{value!r}: not a URL")
    return value


def check_ref_name(value: str) -> str:
    if not _REF_NAME.match(value):
        raise ValueError(f"{value!r} is not a branch or tag name git accepts")
    return value


def check_commit(value: str) -> str:
    if not _COMMIT.match(value):
        raise ValueError(f"{value!r} is not a full commit id (40 or 64 lower-case hex digits)")
    return value


def check_path(value: str) -> str:
    """A directory (or file) inside the repository: relative, never above its root."""
    parts = [p for p in value.split("/") if p not in ("", ".")]
    if value.startswith("/") or ".." in parts or "\\" in value or "\0" in value:
        raise ValueError(f"{value!r}: a path inside the repository, relative to its root, without '..'")
    return value


def interval_seconds(value: str) -> int:
    """Seconds of `1h`, `5m`, `30s`, `1m30s`."""
    m = _INTERVAL.match(value)
    if not value or m is None:
        raise ValueError(f"{value!r} is not an interval (like 30s, 5m, 1h or 1m30s)")
    h, mi, s = (int(g or 0) for g in m.groups())
    seconds = h * 3600 + mi * 60 + s
    if not MIN_INTERVAL_SECONDS <= seconds <= MAX_INTERVAL_SECONDS:
        raise ValueError(f"{value!r}: an interval is from {MIN_INTERVAL_SECONDS}s to {MAX_INTERVAL_SECONDS // 3600}h")
    return seconds


def check_interval(value: str) -> str:
    interval_seconds(value)
    return value


def check_file_name(value: str) -> str:
    """A plain file name: the controller-manager reads it inside its credentials directory
    (--git-credentials-dir), never a path, so a GitSource's writer names no other file of its host."""
    if value in ("", ".", "..") or "/" in value or "\\" in value or "\0" in value or value.startswith("-"):
        raise ValueError(f"{value!r}: a file name in the controller-manager's credentials directory "
                         "(--git-credentials-dir), without a path")
    return value

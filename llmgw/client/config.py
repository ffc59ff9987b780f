"""Where the client finds the server and its credentials: one cluster, or several contexts.

~/.config/llmgw/config.yaml (or $LLMGW_CONFIG, or an explicit path), one cluster:

    server: https://10.0.0.1:7443
    ca: /home/me/.config/llmgw/ca.crt       # the CA that signed the server's certificate
    cert: /home/me/.config/llmgw/admin.crt  # this client's certificate
    key: /home/me/.config/llmgw/admin.key

`server:` may be a list of URLs, every API server of the cluster (a client moves to the next one
when the one it uses goes away; llmgw.client.client says when):

    server: [https://10.0.0.1:7443, https://10.0.0.2:7443, https://10.0.0.3:7443]

or several clusters, each a context (as kubectl's kubeconfig), one of them current:

    current-context: prod
    contexts:
    - name: prod
      server: https://10.0.0.1:7443
      ca: prod/ca.crt                       # relative paths: from the file's folder
      cert: prod/admin.crt
      key: prod/admin.key
    - name: lab
      server: https://10.9.0.1:7443
      ...

`--context NAME` picks one for a command; `llmgw config use-context NAME` changes the current one.
"""
from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from llmgw.api.limits import InputError, check_document
from llmgw.api.manifests import read_yaml

DEFAULT_PATH = "~/.config/llmgw/config.yaml"
DEFAULT_SERVER = "https://127.0.0.1:7443"
CLUSTER_FIELDS = ("server", "ca", "cert", "key")
CURRENT = "current-context"


class ConfigError(Exception):
    """The client configuration is missing or unusable; the message says which file and field."""


def server_urls(servers: str | Sequence[str]) -> list[str]:
    """The servers' URLs, in order, from one URL, a comma-separated list, or a sequence of either
    (the repeatable --server flags): blanks dropped, trailing slashes too."""
    parts = [servers] if isinstance(servers, str) else list(servers)
    return [u.strip().rstrip("/") for part in parts for u in part.split(",") if u.strip()]


def config_path(path: str | os.PathLike[str] | None = None) -> Path:
    return Path(path or os.environ.get("LLMGW_CONFIG") or DEFAULT_PATH).expanduser()


@dataclass
class ClientConfig:
    server: str | list[str] = DEFAULT_SERVER   # a URL, or every server's (the file's list as it is)
    ca: str | None = None
    cert: str | None = None
    key: str | None = None
    path: str | None = None  # the file it came from, for error messages
    context: str | None = None  # the context it is, in a file of contexts

    @classmethod
    def load(cls, path: str | os.PathLike[str] | None = None, context: str | None = None) -> ClientConfig:
        """The cluster of a one-cluster file, or a file's context: `context`, else its current one."""
        p = config_path(path)
        data = _read(p, missing_ok=False)
        if "contexts" not in data:
            if context is not None:
                raise ConfigError(f"{p}: no contexts in this file (it holds one cluster's server, ca, cert, "
                                  f"key), so there is no context {context!r}")
            return _cluster(p, data, "", None)
        entries = _contexts(p, data)
        name = context or data.get(CURRENT)
        if not name:
            raise ConfigError(f"{p}: {CURRENT}: not set; choose one with `llmgw config use-context NAME` or "
                              f"--context NAME (contexts: {_names(entries)})")
        for i, entry in enumerate(entries):
            if entry["name"] == name:
                return _cluster(p, entry, f"contexts[{i}].", str(name))
        where = "--context" if context else CURRENT
        raise ConfigError(f"{p}: {where}: no context {name!r} (contexts: {_names(entries)})")

    def save(self, path: str | os.PathLike[str] | None = None) -> Path:
        """Write this cluster as the whole file (a one-cluster file), replacing what was there."""
        p = config_path(path or self.path)
        _write(p, {k: getattr(self, k) for k in CLUSTER_FIELDS})
        return p

    def save_context(self, name: str, path: str | os.PathLike[str] | None = None) -> Path:
        """Add this cluster to a file as context `name` (replacing one of that name), keeping the
        file's other contexts; the current context too, or `name` when there was none. A
        one-cluster file's cluster is kept as context "default"."""
        p = config_path(path or self.path)
        data = _read(p, missing_ok=True)
        if data and "contexts" not in data:
            data = {CURRENT: "default", "contexts": [{"name": "default", **data}]}
        entries = _contexts(p, data) if data else []
        entry = {"name": name, **{k: getattr(self, k) for k in CLUSTER_FIELDS}}
        kept = [e for e in entries if e["name"] != name]
        data = {CURRENT: data.get(CURRENT) or name, "contexts": [*kept, entry]}
        _write(p, data)
        return p


@dataclass(frozen=True)
class Context:
    name: str
    server: str
    current: bool


def list_contexts(path: str | os.PathLike[str] | None = None) -> list[Context]:
    """A file's contexts in its order; a one-cluster file has none."""
    p = config_path(path)
    data = _read(p, missing_ok=False)
    if "contexts" not in data:
        return []
    return [Context(str(e["name"]), ",".join(server_urls(e.get("server") or DEFAULT_SERVER)),
                    e["name"] == data.get(CURRENT))
            for e in _contexts(p, data)]


def use_context(name: str, path: str | os.PathLike[str] | None = None) -> Path:
    """Make `name` the file's current context; ConfigError when the file has no such context."""
    p = config_path(path)
    names = [c.name for c in list_contexts(p)]
    if name not in names:
        what = f"contexts: {', '.join(names)}" if names else "it has no contexts: one cluster's server, ca, cert, key"
        raise ConfigError(f"{p}: no context {name!r} ({what})")
    data = _read(p, missing_ok=False)
    data[CURRENT] = name
    _write(p, data)
    return p


def _read(p: Path, missing_ok: bool) -> dict[str, Any]:
    if not p.exists():
        if missing_ok:
            return {}
        raise ConfigError(
            f"{p}: no client configuration; run `llmgw ca issue admin NAME --write-config` "
            "or set LLMGW_CONFIG to one")
    try:
        docs = read_yaml(p, max_bytes=1 << 20)
        data = (docs[0] if docs else None) or {}
        check_document(data)
    except InputError as err:
        raise ConfigError(f"{p}: {err.message if err.path == '<document>' else err}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{p}: expected a mapping with server, ca, cert, key (or contexts)")
    expected = {"contexts", CURRENT} if "contexts" in data else set(CLUSTER_FIELDS)
    unknown = set(data) - expected
    if unknown:
        raise ConfigError(f"{p}: unknown field {sorted(map(str, unknown))[0]!r} "
                          f"(expected {', '.join(sorted(expected))})")
    return data


def _contexts(p: Path, data: dict[str, Any]) -> list[dict[str, Any]]:
    """The file's contexts, each a mapping with a unique name and a cluster's fields."""
    entries = data.get("contexts")
    if not isinstance(entries, list) or not entries:
        raise ConfigError(f"{p}: contexts: expected a list of contexts (name, server, ca, cert, key)")
    seen: dict[str, int] = {}
    for i, entry in enumerate(entries):
        if not isinstance(entry, dict):
            raise ConfigError(f"{p}: contexts[{i}]: expected a mapping with name, server, ca, cert, key")
        unknown = set(entry) - {"name", *CLUSTER_FIELDS}
        if unknown:
            raise ConfigError(f"{p}: contexts[{i}]: unknown field {sorted(map(str, unknown))[0]!r} "
                              "(expected name, server, ca, cert, key)")
        name = entry.get("name")
        if not isinstance(name, str) or not name:
            raise ConfigError(f"{p}: contexts[{i}].name: required, a string")
        if name in seen:
            raise ConfigError(f"{p}: contexts[{i}].name: {name!r} is contexts[{seen[name]}]'s name too")
        seen[name] = i
    if data.get(CURRENT) is not None and not isinstance(data[CURRENT], str):
        raise ConfigError(f"{p}: {CURRENT}: expected a context's name")
    return entries


def _cluster(p: Path, data: dict[str, Any], where: str, context: str | None) -> ClientConfig:
    """A ClientConfig from one cluster's fields, its files relative to the config file's folder."""
    cfg = ClientConfig(server=_server(p, data.get("server"), where), path=str(p), context=context)
    for field in ("ca", "cert", "key"):
        value = data.get(field)
        if not value:
            raise ConfigError(f"{p}: {where}{field}: required")
        full = p.parent / Path(str(value)).expanduser()
        if not full.exists():
            raise ConfigError(f"{p}: {where}{field}: {full} does not exist")
        setattr(cfg, field, str(full))
    return cfg


def _server(p: Path, value: Any, where: str) -> str | list[str]:
    """A cluster's `server:`: a URL, or a list of them (every server of the cluster)."""
    if not value:
        return DEFAULT_SERVER
    if isinstance(value, list):
        if not all(isinstance(u, str) and u.strip() for u in value):
            raise ConfigError(f"{p}: {where}server: expected a URL or a list of URLs")
        return [str(u) for u in value]
    return str(value)


def _names(entries: list[dict[str, Any]]) -> str:
    return ", ".join(str(e["name"]) for e in entries)


def _write(p: Path, data: dict[str, Any]) -> None:
    """Replace the file at once (no reader sees half of it), readable by its owner alone."""
    p.parent.mkdir(parents=True, exist_ok=True)
    tmp = p.with_name(p.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        yaml.safe_dump(data, f, sort_keys=False)
    os.replace(tmp, p)

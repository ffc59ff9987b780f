"""Where the client finds the server and its credentials.

~/.config/llmgw/config.yaml (or $LLMGW_CONFIG, or an explicit path):

    server: https://10.0.0.1:7443
    ca: /home/me/.config/llmgw/ca.crt       # the CA that signed the server's certificate
    cert: /home/me/.config/llmgw/admin.crt  # this client's certificate
    key: /home/me/.config/llmgw/admin.key
"""
from __future__ import annotations

import os
from dataclasses import asdict, dataclass
from pathlib import Path

import yaml

from llmgw.api.limits import InputError, check_document
from llmgw.api.manifests import read_yaml

DEFAULT_PATH = "~/.config/llmgw/config.yaml"
DEFAULT_SERVER = "https://127.0.0.1:7443"


class ConfigError(Exception):
    """The client configuration is missing or unusable; the message says which file and field."""


def config_path(path: str | os.PathLike[str] | None = None) -> Path:
    return Path(path or os.environ.get("LLMGW_CONFIG") or DEFAULT_PATH).expanduser()


@dataclass
class ClientConfig:
    server: str = DEFAULT_SERVER
    ca: str | None = None
    cert: str | None = None
    key: str | None = None
    path: str | None = None  # the file it came from, for error messages

    @classmethod
    def load(cls, path: str | os.PathLike[str] | None = None) -> "ClientConfig":
        p = config_path(path)
        if not p.exists():
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
            raise ConfigError(f"{p}: expected a mapping with server, ca, cert, key")
        unknown = set(data) - {"server", "ca", "cert", "key"}
        if unknown:
            raise ConfigError(f"{p}: unknown field {sorted(unknown)[0]!r} (expected server, ca, cert, key)")
        base = p.parent
        cfg = cls(server=str(data.get("server") or DEFAULT_SERVER), path=str(p))
        for field in ("ca", "cert", "key"):
            value = data.get(field)
            if not value:
                raise ConfigError(f"{p}: field {field!r} is required")
            full = (base / Path(str(value)).expanduser())
            if not full.exists():
                raise ConfigError(f"{p}: {field}: {full} does not exist")
            setattr(cfg, field, str(full))
        return cfg

    def save(self, path: str | os.PathLike[str] | None = None) -> Path:
        p = config_path(path or self.path)
        p.parent.mkdir(parents=True, exist_ok=True)
        data = {k: v for k, v in asdict(self).items() if k != "path"}
        tmp = p.with_name(p.name + ".tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            yaml.safe_dump(data, f, sort_keys=False)
        os.replace(tmp, p)
        return p

"""Agent configuration: a YAML file (examples/agent.yaml) overridden by command-line flags.

Keys are spelled as the flags are (`state-dir`, `port-range`, ...). Unknown
keys are refused with their path, so a typo never silently means a default.
"""
from __future__ import annotations

import re
import socket
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from llmgw.agent.discovery.infiniband import DEFAULT_IB_ROOT
from llmgw.api import PortRange, check_dns1123_label
from llmgw.api.fabrics import FabricError, FabricSpec
from llmgw.api.limits import InputError, check_document
from llmgw.api.manifests import read_yaml
from llmgw.api.sources import default_hub
from llmgw.client.config import server_urls
from llmgw.engines.engine import executable_name
from llmgw.pki import renewal

DEFAULT_STATE_DIR = "/var/lib/llmgw/agent"
DEFAULT_SERVER_PORT = 7443
MAX_CONFIG_BYTES = 1 << 20  # a config of a few dozen lines; anything near this is not one


class ConfigError(Exception):
    pass


def parse_duration(value: Any) -> float:
    """Seconds from 2, 2.5, "2", "2s", "500ms", "1m"."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        seconds = float(value)
    else:
        m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*(ms|s|m)?\s*", str(value))
        if not m:
            raise ValueError(f"{value!r} is not a duration (seconds, or a number with ms, s or m)")
        seconds = float(m.group(1)) * {"ms": 0.001, "s": 1, "m": 60, None: 1}[m.group(2)]
    if seconds < 0:
        raise ValueError(f"{value!r} is negative")
    return seconds


_UNITS = {"": 1, "k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12,
          "ki": 1 << 10, "mi": 1 << 20, "gi": 1 << 30, "ti": 1 << 40}


def parse_size(value: Any) -> int:
    """Bytes from 1000000, "500G", "1.5Ti", "800Mi" (Kubernetes' quantities, B optional)."""
    if isinstance(value, int) and not isinstance(value, bool):
        size = value
    else:
        m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([kmgt]i?)?b?\s*", str(value), re.IGNORECASE)
        if not m:
            raise ValueError(f"{value!r} is not a size (bytes, or a number with K, M, G, T, Ki, Mi, Gi, Ti)")
        size = int(float(m.group(1)) * _UNITS[(m.group(2) or "").lower()])
    if size < 0:
        raise ValueError(f"{value!r} is negative")
    return size


def parse_port_range(value: Any) -> PortRange:
    if isinstance(value, PortRange):
        return value
    if isinstance(value, dict):
        rng = PortRange(**value)
    else:
        m = re.fullmatch(r"\s*(\d+)\s*-\s*(\d+)\s*", str(value))
        if not m:
            raise ValueError(f"{value!r} is not a port range FIRST-LAST, e.g. 30000-32767")
        rng = PortRange(first=int(m.group(1)), last=int(m.group(2)))
    if rng.first > rng.last:
        raise ValueError(f"port range {rng.first}-{rng.last} is empty (first > last)")
    return rng


def _kebab(name: str) -> str:
    return name.replace("_", "-")


class AgentConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", alias_generator=_kebab, populate_by_name=True,
                              arbitrary_types_allowed=True)

    node: str | None = None
    server: str | list[str] | None = None   # a URL, comma-separated URLs, or a list: every API server
    ca: str | None = None
    cert: str | None = None
    key: str | None = None
    advertise_address: str | None = None
    labels: dict[str, str] = Field(default_factory=dict)
    fabrics: list[FabricSpec] = Field(default_factory=list)
    nvidia_smi: str | None = None          # None: /usr/bin/nvidia-smi, then PATH
    nvidia_smi_timeout: float = 10.0
    ib_root: str = DEFAULT_IB_ROOT
    engines: dict[str, str] = Field(default_factory=dict)
    state_dir: str = DEFAULT_STATE_DIR
    port_range: PortRange = Field(default_factory=PortRange)
    drain_delay: float = 2.0               # after a shard is marked for deletion, before SIGTERM
    stop_grace_period: float = 30.0        # SIGTERM to SIGKILL
    heartbeat_interval: float = 5.0
    probe_interval: float = 1.0
    # A shard that was Ready and whose probe keeps failing this long is stopped and Failed (reason
    # Unhealthy), so its replica is rebuilt; 0: never (it stays unready while the probe fails)
    liveness_timeout: float = 30.0
    rediscover_interval: float = 60.0      # GPU/IB/engine rediscovery; 0: only at start
    # Each GPU's free memory read again (nvidia-smi), for placement; 0: only at rediscovery. The Node is
    # written when a GPU's figure moved by gpu_memory_step MiB or more since it was reported.
    gpu_memory_interval: float = 10.0
    gpu_memory_step: int = Field(default=1024, ge=0)
    log_lines: int = 30                    # lines of an engine's log reported when it exits
    metrics_listen: str | None = None      # HOST:PORT of GET /metrics (llmgw/agent/metrics.py); None: off
    logs_listen: str | None = None         # HOST:PORT of the engine logs, to the API server (llmgw/agent/logs.py)
    weights_dir: str | None = None         # the weights cache (llmgw/weights/cache.py); None: <state-dir>/weights
    weights_cache_size: int | None = None  # its budget in bytes; None: what the disk holds
    hub_endpoint: str = Field(default_factory=default_hub)   # the Hugging Face Hub of hf:// sources, or a mirror
    hub_token_file: str | None = None      # its token; None: HF_TOKEN from the environment, if set
    weights_peers: bool = True             # peers before the origin (with logs-listen; llmgw/weights/peers.py)
    # the certificate renewed at this fraction of its lifetime (llmgw/pki/renewal.py); 0: never
    renew_fraction: float = Field(default=renewal.FRACTION, ge=0, lt=1)
    renew_jitter: float = Field(default=renewal.JITTER, ge=0, le=1)   # plus up to this part of what is then left

    @field_validator("node")
    @classmethod
    def _node(cls, v: Any) -> Any:
        return None if v is None else check_dns1123_label(v)

    @field_validator("fabrics", mode="before")
    @classmethod
    def _fabrics(cls, v: Any) -> list[FabricSpec]:
        out = []
        for item in v or []:
            if isinstance(item, FabricSpec):
                out.append(item)
            elif isinstance(item, str):
                out.append(FabricSpec.parse(item))
            elif isinstance(item, dict) and set(item) <= {"name", "adapters"} and "name" in item:
                adapters = item.get("adapters")
                text = item["name"] + (":" + ",".join(map(str, adapters)) if adapters else "")
                out.append(FabricSpec.parse(text))
            else:
                raise ValueError(f"{item!r}: give a fabric as 'NAME', 'NAME:ADAPTER,ADAPTER' "
                                 "or {name: NAME, adapters: [ADAPTER, ...]}")
        return out

    @field_validator("engines", mode="before")
    @classmethod
    def _engines(cls, v: Any) -> dict[str, str]:
        out = {}
        for name, path in (v or {}).items():   # the engines' programs (llmgw.engines), or an engine's name
            out[executable_name(name)] = str(path)
        return out

    @field_validator("port_range", mode="before")
    @classmethod
    def _port_range(cls, v: Any) -> PortRange:
        return parse_port_range(v)

    @field_validator("weights_cache_size", mode="before")
    @classmethod
    def _size(cls, v: Any) -> int | None:
        return None if v is None else parse_size(v)

    @field_validator("drain_delay", "stop_grace_period", "heartbeat_interval", "probe_interval", "liveness_timeout",
                     "nvidia_smi_timeout", "rediscover_interval", "gpu_memory_interval", mode="before")
    @classmethod
    def _duration(cls, v: Any) -> float:
        return parse_duration(v)

    # ------------------------------------------------------------------ use

    @property
    def node_name(self) -> str:
        if self.node:
            return self.node
        host = socket.gethostname().split(".")[0].lower()
        try:
            return check_dns1123_label(host)
        except ValueError:
            raise ConfigError(f"the host name {host!r} is not a valid node name; set `node:` in the "
                              "config file or pass --node") from None

    def require_connection(self) -> None:
        missing = [k for k in ("server", "ca", "cert", "key") if not getattr(self, k)]
        if missing:
            raise ConfigError("missing " + ", ".join(missing) + ": set them in the config file or pass "
                              + " ".join(f"--{k}" for k in missing))
        for k in ("ca", "cert", "key"):
            if not Path(getattr(self, k)).is_file():
                raise ConfigError(f"{k} file not found: {getattr(self, k)}")

    @property
    def weights_path(self) -> str:
        return self.weights_dir or str(Path(self.state_dir) / "weights")

    @property
    def server_url(self) -> str:
        """The first server's URL."""
        return self.server_urls[0]

    @property
    def server_urls(self) -> list[str]:
        """Every server's URL, in order, each with a scheme and a port (https, 7443 unless given)."""
        return [_full_url(url) for url in server_urls(self.server or "")] or [_full_url("")]


def _full_url(url: str) -> str:
    if "://" not in url:
        url = "https://" + url
    if not re.search(r":\d+$", url.split("://", 1)[1].split("/")[0]):
        url = url.rstrip("/") + f":{DEFAULT_SERVER_PORT}"
    return url


def load_config(path: str | None = None, overrides: dict[str, Any] | None = None) -> AgentConfig:
    """Read the file (if any), apply overrides (flag values, None meaning 'not given'), validate."""
    data: dict[str, Any] = {}
    source = "command line"
    if path:
        source = path
        try:
            docs = read_yaml(Path(path), max_bytes=MAX_CONFIG_BYTES)
            if len(docs) > 1:
                raise InputError("<document>", f"{len(docs)} YAML documents; the agent reads one")
            loaded = docs[0] if docs else None
            check_document(loaded)
        except OSError as err:
            raise ConfigError(f"cannot read config file {path}: {err.strerror or err}") from None
        except InputError as err:
            raise ConfigError(f"{path}: {err.message if err.path == '<document>' else err}") from None
        if loaded is not None and not isinstance(loaded, dict):
            raise ConfigError(f"{path}: expected a mapping of settings, found {type(loaded).__name__}")
        data = {_kebab(str(k)): v for k, v in (loaded or {}).items()}
    for key, value in (overrides or {}).items():
        if value is None or value == () or value == []:
            continue
        key = _kebab(key)
        if key == "engines":
            data["engines"] = {**(data.get("engines") or {}), **value}
        else:
            data[key] = value
    try:
        return AgentConfig.model_validate(data)
    except FabricError as err:
        raise ConfigError(f"{source}: {err}") from None
    except ValidationError as err:
        lines = []
        for e in err.errors():
            where = ".".join(str(p) for p in e["loc"]) or "(top level)"
            msg = e["msg"].removeprefix("Value error, ")
            lines.append(f"{source}: {where}: {msg}")
        raise ConfigError("\n".join(lines)) from None

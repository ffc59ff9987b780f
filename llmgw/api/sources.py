"""Where a Model's weights come from (`spec.source`), and the content digest a Model may pin.

A source is one of:

- a path on the node (today's behaviour: a shared filesystem, or a hub id an engine resolves
  itself); the agent passes it to the engine as it is;
- `hf://ORG/NAME[@REVISION]`: a Hugging Face Hub repository (at a branch, tag or commit; `main`
  when none), which the agent pulls into its cache;
- `http://HOST/DIR/` or `https://...`: a model directory described by a manifest, `DIR/manifest.json`
  (llmgw/weights/manifest.py), which the agent pulls into its cache.

A scheme is one class with `parse`; another (`s3://`) is one more class in SCHEMES. The agent
resolves a pulled source to its content digest (`sha256:` and 64 hex digits, llmgw.weights); a
Model's `spec.digest` pins it, and a pull that finds other content fails.
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import ClassVar
from urllib.parse import urlsplit

DIGEST_RE = re.compile(r"sha256:[0-9a-f]{64}")
DEFAULT_HUB = "https://huggingface.co"
# The hub's own rules for a repository id: ORG/NAME, letters, digits, '-', '_', '.'; no '--' or '..'.
_HUB_PART = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9._-]{0,94}[A-Za-z0-9])?")
_REVISION = re.compile(r"[A-Za-z0-9][A-Za-z0-9._/-]{0,254}")


def default_hub() -> str:
    """The hub that `hf://` sources are asked of: HF_ENDPOINT (the hub clients' own variable for a
    mirror), else huggingface.co."""
    return os.environ.get("HF_ENDPOINT") or DEFAULT_HUB


@dataclass(frozen=True)
class HubSource:
    """`hf://ORG/NAME[@REVISION]`."""
    scheme: ClassVar[str] = "hf"
    repo: str
    revision: str = "main"

    @classmethod
    def parse(cls, rest: str) -> HubSource:
        repo, _, revision = rest.partition("@")
        parts = repo.split("/")
        if len(parts) != 2 or not all(_HUB_PART.fullmatch(p) for p in parts) or "--" in repo or ".." in repo:
            raise ValueError(f"hf://{rest}: the repository must be ORG/NAME (letters, digits, '-', '_', '.')")
        if revision and (not _REVISION.fullmatch(revision) or ".." in revision):
            raise ValueError(f"hf://{rest}: {revision!r} is not a branch, tag or commit")
        return cls(repo, revision or "main")

    @property
    def text(self) -> str:
        return f"hf://{self.repo}@{self.revision}"


@dataclass(frozen=True)
class HttpSource:
    """`http(s)://HOST/DIR/`: a directory whose `manifest.json` lists its files."""
    scheme: ClassVar[str] = "http"
    url: str       # ends with '/'

    @classmethod
    def parse(cls, url: str) -> HttpSource:
        parts = urlsplit(url)
        if not parts.hostname:
            raise ValueError(f"{url}: no host")
        if parts.query or parts.fragment or parts.username or parts.password:
            raise ValueError(f"{url}: a model directory's URL has no query, fragment or credentials "
                             "(the agent's config holds credentials, never the Model)")
        if not url.endswith("/"):
            raise ValueError(f"{url}: a model directory's URL ends with '/' (its files, and manifest.json, "
                             "are under it)")
        return cls(url)

    @property
    def manifest_url(self) -> str:
        return self.url + "manifest.json"

    @property
    def text(self) -> str:
        return self.url


PulledSource = HubSource | HttpSource


def parse_source(value: str) -> PulledSource | None:
    """The pulled source `value` names, None for a path; ValueError says what is wrong."""
    if value.startswith("-"):
        raise ValueError(f"{value!r} starts with '-': the engine would read it as a flag")
    scheme, sep, rest = value.partition("://")
    if not sep:
        return None
    if scheme == "hf":
        return HubSource.parse(rest)
    if scheme in ("http", "https"):
        return HttpSource.parse(value)
    raise ValueError(f"{value}: unknown scheme {scheme!r}: give a path on the node, hf://ORG/NAME[@REVISION] "
                     "or http(s)://HOST/DIR/")


def check_digest(value: str) -> str:
    if not DIGEST_RE.fullmatch(value):
        raise ValueError(f"{value!r} is not a content digest: sha256: and 64 lowercase hex digits")
    return value

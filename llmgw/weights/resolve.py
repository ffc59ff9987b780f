"""A pulled source to its listing: the files to fetch, their sizes, and how each is verified.

The hub is asked with `huggingface_hub` (the model's info at the revision, with its files'
metadata: the commit, and each file's LFS sha256 or git blob id), against a configurable endpoint
(a private mirror) with a token from the agent's config or HF_TOKEN, never from etcd. An HTTP
origin's listing is its manifest. Another scheme (S3) is one more `resolve` branch returning the
same Listing.
"""
from __future__ import annotations

import asyncio
import os
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import quote

import aiohttp

from llmgw.api.sources import DEFAULT_HUB, HttpSource, HubSource, PulledSource
from llmgw.weights import manifest
from llmgw.weights.digest import FileEntry, check_path, content_digest
from llmgw.weights.errors import PullError, Reason


@dataclass(frozen=True)
class HubConfig:
    endpoint: str = DEFAULT_HUB
    token_file: str | None = None

    def token(self) -> str | None:
        """The token file's first line, else HF_TOKEN; read at each pull, so a rotated file counts."""
        if self.token_file:
            try:
                return Path(self.token_file).read_text().strip() or None
            except OSError as err:
                raise PullError("OriginUnreachable", f"cannot read the hub token file {self.token_file}: "
                                f"{err.strerror or err}") from None
        return os.environ.get("HF_TOKEN") or None


@dataclass(frozen=True)
class Listing:
    source: str                   # the source as the cache's resolution index knows it
    files: list[FileEntry]
    headers: dict[str, str] = field(default_factory=dict)     # sent with each file's GET
    # Known before fetching when every file's sha256 is (a manifest); a hub listing's files outside
    # LFS are named by git blob id, so its digest is known once they are fetched.
    digest: str | None = None

    @property
    def total(self) -> int:
        return sum(f.size for f in self.files)


async def resolve(source: PulledSource, http: aiohttp.ClientSession, hub: HubConfig) -> Listing:
    if isinstance(source, HubSource):
        return await asyncio.to_thread(_hub_listing, source, hub)
    return await _http_listing(source, http)


def _hub_listing(source: HubSource, hub: HubConfig) -> Listing:
    # Imported at the first hub pull, not with the agent: huggingface_hub and its HTTP stack are
    # about a third of an agent's start (0.3 s of CPU), and most nodes never pull from a hub.
    from huggingface_hub import HfApi, hf_hub_url
    from huggingface_hub.errors import HfHubHTTPError, RepositoryNotFoundError, RevisionNotFoundError

    token = hub.token()
    api = HfApi(endpoint=hub.endpoint, token=token or False)
    where = f"{source.text} on {hub.endpoint}"
    try:
        info = api.model_info(source.repo, revision=source.revision, files_metadata=True)
    except (RepositoryNotFoundError, RevisionNotFoundError) as err:
        raise PullError("SourceNotFound", f"{where}: {_first_line(err)}") from None
    except HfHubHTTPError as err:
        status = err.response.status_code if err.response is not None else None
        reason: Reason = "SourceNotFound" if status in (401, 403, 404) else "OriginUnreachable"
        raise PullError(reason, f"{where}: {_first_line(err)}") from None
    except Exception as err:  # noqa: BLE001 the hub client's transport errors are its HTTP library's, not ours to name
        raise PullError("OriginUnreachable", f"{where}: {type(err).__name__}: {err}") from None
    if not info.sha or info.siblings is None:
        raise PullError("BadManifest", f"{where}: the hub named no commit or no files")
    files = []
    for s in info.siblings:
        try:
            path = check_path(s.rfilename)
        except ValueError as err:
            raise PullError("BadManifest", f"{where}: {err}") from None
        size = s.lfs.size if s.lfs is not None else s.size
        if size is None or (s.lfs is None and not s.blob_id):
            raise PullError("BadManifest", f"{where}: {path}: no size or hash")
        url = hf_hub_url(source.repo, path, revision=info.sha, endpoint=hub.endpoint)
        files.append(FileEntry(path, size, url, sha256=s.lfs.sha256 if s.lfs is not None else None,
                               git_sha1=None if s.lfs is not None else s.blob_id))
    headers = {"authorization": f"Bearer {token}"} if token else {}
    # The commit, not the branch: a moved branch is another listing, resolved again.
    return Listing(f"hf://{source.repo}@{info.sha}", files, headers)


async def _http_listing(source: HttpSource, http: aiohttp.ClientSession) -> Listing:
    where = source.manifest_url
    try:
        async with http.get(where) as resp:
            if resp.status == 404:
                raise PullError("SourceNotFound", f"{where}: 404 Not Found")
            if resp.status != 200:
                raise PullError("OriginUnreachable", f"{where}: HTTP {resp.status}")
            raw = await resp.content.read(manifest.MAX_MANIFEST_BYTES + 1)
    except (aiohttp.ClientError, asyncio.TimeoutError) as err:
        raise PullError("OriginUnreachable", f"{where}: {type(err).__name__}: {err}") from None
    if len(raw) > manifest.MAX_MANIFEST_BYTES:
        raise PullError("BadManifest", f"{where}: over {manifest.MAX_MANIFEST_BYTES} bytes")
    m = manifest.parse(raw, where)
    files = [FileEntry(f.path, f.size, source.url + quote(f.path), sha256=f.sha256) for f in m.files]
    digest = content_digest([(f.path, f.size, f.sha256) for f in m.files])
    return Listing(digest, files, digest=digest)


def _first_line(err: Exception) -> str:
    return str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__

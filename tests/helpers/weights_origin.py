"""Origins of weights for tests, speaking the real protocols on a loopback port:

- the few Hugging Face Hub endpoints `huggingface_hub` calls: a model's info at a revision
  (`GET /api/models/ORG/NAME/revision/REV`, the commit and each file's size, git blob id and
  LFS sha256), and a file (`HEAD|GET /ORG/NAME/resolve/REV/PATH`, with X-Repo-Commit, ETag,
  X-Linked-Etag and X-Linked-Size as the hub sends them, and Range);
- a plain HTTP origin of model directories, each with its manifest.json
  (`GET /models/NAME/manifest.json`, `GET /models/NAME/PATH` with Range).

Files are generated. Faults, each for the next request of one file: `corrupt` (one byte flipped,
the listing unchanged), `drop_after` (the connection cut after n bytes). Every request is logged
(method, path, Range header), and the bytes of files' bodies sent are counted (`bytes_sent`).
"""
from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import random
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from aiohttp import web

from llmgw.dev.cluster import LocalCluster, NodePlan
from llmgw.dev.process import free_port

LFS_FROM = 1024       # files this big or bigger are LFS files on the hub (named by sha256)


def generated(seed: int, sizes: dict[str, int]) -> dict[str, bytes]:
    """Files of the given sizes with reproducible pseudo-random bytes."""
    rng = random.Random(seed)
    return {path: rng.randbytes(n) for path, n in sizes.items()}


def git_blob_id(data: bytes) -> str:
    return hashlib.sha1(f"blob {len(data)}\0".encode() + data, usedforsecurity=False).hexdigest()


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def content_digest(files: dict[str, bytes]) -> str:
    """The digest llmgw/weights/digest.py defines, computed here independently of it."""
    lines = "".join(f"{sha256(d)} {len(d)} {p}\n" for p, d in sorted(files.items()))
    return "sha256:" + hashlib.sha256(lines.encode()).hexdigest()


@dataclass
class Logged:
    method: str
    path: str
    range: str | None


@dataclass
class WeightsOrigin:
    repos: dict[str, dict[str, bytes]] = field(default_factory=dict)      # hub: "org/name" -> files
    commits: dict[str, str] = field(default_factory=dict)                  # hub: "org/name" -> commit
    dirs: dict[str, dict[str, bytes]] = field(default_factory=dict)        # http: name -> files
    log: list[Logged] = field(default_factory=list)
    bytes_sent: int = 0
    rate: float | None = None        # bytes/s each file's body is sent at (an origin slower than loopback)
    corrupt_next: set[str] = field(default_factory=set)
    drop_next: dict[str, int] = field(default_factory=dict)
    url: str = ""
    _runner: web.AppRunner | None = None

    # ------------------------------------------------------------- setup
    def add_repo(self, repo: str, files: dict[str, bytes]) -> str:
        self.repos[repo] = files
        self.commits[repo] = hashlib.sha1(repr(sorted(files.items())).encode(), usedforsecurity=False).hexdigest()
        return self.commits[repo]

    def add_dir(self, name: str, files: dict[str, bytes]) -> str:
        self.dirs[name] = files
        return f"{self.url}/models/{name}/"

    def corrupt(self, path: str) -> None:
        self.corrupt_next.add(path)

    def drop_after(self, path: str, n: int) -> None:
        self.drop_next[path] = n

    def requests(self, method: str = "GET", suffix: str = "") -> list[Logged]:
        return [r for r in self.log if r.method == method and r.path.endswith(suffix)]

    # ------------------------------------------------------------ serving
    async def start(self, port: int = 0) -> WeightsOrigin:
        app = web.Application(middlewares=[self._logged])
        app.router.add_get("/api/models/{org}/{name}/revision/{rev}", self._model_info)
        app.router.add_get("/api/models/{org}/{name}", self._model_info)
        app.router.add_route("*", "/{org}/{name}/resolve/{rev}/{path:.+}", self._hub_file)
        app.router.add_get("/models/{name}/manifest.json", self._manifest)
        app.router.add_get("/models/{name}/{path:.+}", self._dir_file)
        self._runner = web.AppRunner(app)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", port)
        await site.start()
        port = self._runner.addresses[0][1]
        self.url = f"http://127.0.0.1:{port}"
        return self

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    @web.middleware
    async def _logged(self, request: web.Request, handler) -> web.StreamResponse:
        self.log.append(Logged(request.method, request.path, request.headers.get("Range")))
        return await handler(request)

    def _repo(self, request: web.Request) -> tuple[str, dict[str, bytes]]:
        repo = f"{request.match_info['org']}/{request.match_info['name']}"
        if repo not in self.repos:
            raise web.HTTPNotFound(headers={"X-Error-Code": "RepoNotFound"}, text="Repository not found")
        rev = request.match_info.get("rev", "main")
        if rev not in ("main", self.commits[repo]):
            raise web.HTTPNotFound(headers={"X-Error-Code": "RevisionNotFound"}, text="Invalid rev id")
        return repo, self.repos[repo]

    async def _model_info(self, request: web.Request) -> web.Response:
        repo, files = self._repo(request)
        siblings = []
        for path, data in sorted(files.items()):
            s: dict[str, object] = {"rfilename": path, "size": len(data), "blobId": git_blob_id(data)}
            if len(data) >= LFS_FROM:
                s["lfs"] = {"size": len(data), "sha256": sha256(data), "pointerSize": 134}
            siblings.append(s)
        return web.json_response({"id": repo, "modelId": repo, "sha": self.commits[repo], "private": False,
                                  "siblings": siblings})

    async def _hub_file(self, request: web.Request) -> web.StreamResponse:
        repo, files = self._repo(request)
        path = request.match_info["path"]
        if path not in files:
            raise web.HTTPNotFound(headers={"X-Error-Code": "EntryNotFound"}, text="Entry not found")
        data = files[path]
        etag = sha256(data) if len(data) >= LFS_FROM else git_blob_id(data)
        headers = {"X-Repo-Commit": self.commits[repo], "ETag": f'"{etag}"'}
        if len(data) >= LFS_FROM:
            headers |= {"X-Linked-Etag": f'"{etag}"', "X-Linked-Size": str(len(data))}
        return await self._serve(request, f"{repo}/{path}", data, headers)

    async def _manifest(self, request: web.Request) -> web.Response:
        files = self.dirs.get(request.match_info["name"])
        if files is None:
            raise web.HTTPNotFound()
        listing = [{"path": p, "size": len(d), "sha256": sha256(d)} for p, d in sorted(files.items())]
        return web.Response(body=json.dumps({"files": listing}), content_type="application/json")

    async def _dir_file(self, request: web.Request) -> web.StreamResponse:
        name, path = request.match_info["name"], request.match_info["path"]
        files = self.dirs.get(name)
        if files is None or path not in files:
            raise web.HTTPNotFound()
        return await self._serve(request, f"{name}/{path}", files[path], {})

    async def _serve(self, request: web.Request, key: str, data: bytes,
                     headers: dict[str, str]) -> web.StreamResponse:
        if key in self.corrupt_next:
            self.corrupt_next.discard(key)
            data = bytes([data[0] ^ 0xFF]) + data[1:]
        start = 0
        rng = request.headers.get("Range")
        if rng and rng.startswith("bytes=") and rng.endswith("-"):
            start = int(rng[len("bytes="):-1])
        status = 206 if start else 200
        if start:
            headers = {**headers, "Content-Range": f"bytes {start}-{len(data) - 1}/{len(data)}"}
        body = data[start:]
        resp = web.StreamResponse(status=status, headers={**headers, "Content-Length": str(len(body)),
                                                          "Accept-Ranges": "bytes"})
        await resp.prepare(request)
        if request.method == "HEAD":
            return resp
        cut = self.drop_next.pop(key, None)
        if cut is not None:
            await resp.write(body[:cut])
            self.bytes_sent += len(body[:cut])
            assert request.transport is not None
            request.transport.abort()        # the connection drops mid-body
            return resp
        step = len(body) if self.rate is None else 1 << 16
        for at in range(0, len(body), step):
            await resp.write(body[at:at + step])
            self.bytes_sent += len(body[at:at + step])
            if self.rate is not None:
                await asyncio.sleep(step / self.rate)
        await resp.write_eof()
        return resp


@contextlib.contextmanager
def cluster_with_hub(directory: Path, nodes: list[NodePlan], hub_port: int) -> Iterator[LocalCluster]:
    """A local cluster (llmgw/dev) whose agents find the hub as every hub client does, by
    HF_ENDPOINT, at `hub_port` (the hub itself starts in the test)."""
    mp = pytest.MonkeyPatch()
    mp.setenv("HF_ENDPOINT", f"http://127.0.0.1:{hub_port}")
    c = LocalCluster(directory, nodes, gateway_port=free_port())
    try:
        c.start()
        yield c
    finally:
        c.stop()
        mp.undo()


@pytest.fixture
async def origin():
    """A started WeightsOrigin, stopped after the test."""
    o = await WeightsOrigin().start()
    yield o
    await o.stop()

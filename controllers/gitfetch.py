"""A GitSource's commit on local disk: fetched and checked out by the git program, one directory per source.

Why the git program and not a library: of the Python libraries (dulwich, GitPython, pygit2),
GitPython runs the git program anyway and pygit2 needs libgit2 built with the same TLS and
ssh as the host, while dulwich speaks the protocols itself, synchronously (a thread per
fetch) and without the host's git configuration. git fetches https, ssh and file:// with the
host's credential, proxy and ssh settings, shallow, and runs as a child process the event
loop waits on without blocking (asyncio's subprocesses): no Git protocol of our own, and a
timeout that kills it.
"""
from __future__ import annotations

import asyncio
import contextlib
import os
import shlex
import shutil
import signal
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import unquote, urlsplit

from llmgw.api import GitRef


class GitError(Exception):
    """A fetch that failed: what git said (its last lines), or why it was not run."""


@dataclass(frozen=True)
class Checkout:
    revision: str    # the commit id
    root: Path       # its files


class GitCache:
    """`root`/<source name>: a repository each source's commits are fetched into and checked out in.

    A source reaches no further than the controller-manager was told: its secretRef.file is a file
    of `credentials` (a link out of it is refused), and a file:// URL a repository under `file_root`
    (None: no file:// URL). Both are checked before anything is read or git runs."""

    def __init__(self, root: Path, timeout: float, credentials: Path, file_root: Path | None) -> None:
        self.root, self.timeout = root, timeout
        self.credentials, self.file_root = credentials, file_root

    async def fetch(self, name: str, url: str, ref: GitRef, secret_file: str | None) -> Checkout:
        """The commit `ref` names at `url` now, checked out under root/name."""
        repo = self.root / name
        url = self._confined_url(url)
        secret = None if secret_file is None else str(
            _inside(self.credentials / secret_file, self.credentials, f"secretRef.file {secret_file}"))
        env = _environment(url, secret)
        if not (repo / ".git").is_dir():
            repo.mkdir(parents=True, exist_ok=True)
            await self._git(repo, env, "init", "--quiet")
        if ref.commit is not None:
            want = ref.commit
            if not await self._has(repo, env, want):
                # A server may refuse an unadvertised commit: then all branches and tags are fetched.
                try:
                    await self._git(repo, env, "fetch", "--quiet", "--no-tags", "--depth", "1", "--", url, want)
                except GitError:
                    await self._git(repo, env, "fetch", "--quiet", "--tags", "--", url,
                                    "+refs/heads/*:refs/remotes/source/*")
            if not await self._has(repo, env, want):
                raise GitError(f"commit {want} is not in {url}")
        else:
            refspec = f"refs/heads/{ref.branch}" if ref.branch is not None else f"refs/tags/{ref.tag}"
            await self._git(repo, env, "fetch", "--quiet", "--no-tags", "--depth", "1", "--force", "--", url, refspec)
            want = (await self._git(repo, env, "rev-parse", "--verify", "FETCH_HEAD^{commit}")).strip()
        head = await self._git(repo, env, "rev-parse", "--verify", "--quiet", "HEAD", check=False)
        if head.strip() != want:
            await self._git(repo, env, "checkout", "--quiet", "--force", "--detach", want)
            await self._git(repo, env, "clean", "-qffdx")
        return Checkout(want, repo)

    def _confined_url(self, url: str) -> str:
        """A file:// URL as the path it names, its links resolved, if that is under file_root."""
        parts = urlsplit(url)
        if parts.scheme != "file":
            return url
        if self.file_root is None:
            raise GitError(f"{url}: file:// URLs are refused (the controller-manager has no --git-file-root)")
        if parts.netloc not in ("", "localhost"):
            raise GitError(f"{url}: a file:// URL names no host")
        return f"file://{_inside(Path(unquote(parts.path)), self.file_root, url)}"

    def forget(self, name: str) -> None:
        """A source that is gone leaves nothing on disk."""
        shutil.rmtree(self.root / name, ignore_errors=True)

    async def _has(self, repo: Path, env: dict[str, str], commit: str) -> bool:
        out = await self._git(repo, env, "rev-parse", "--verify", "--quiet", f"{commit}^{{commit}}", check=False)
        return out.strip() == commit

    async def _git(self, repo: Path, env: dict[str, str], *args: str, check: bool = True) -> str:
        proc = await asyncio.create_subprocess_exec(
            "git", "-C", str(repo), *args, env=env, stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, start_new_session=True)
        try:
            out, err = await asyncio.wait_for(proc.communicate(), self.timeout)
        except TimeoutError:
            raise GitError(f"git {args[0]} took longer than {self.timeout:g} s") from None
        finally:
            if proc.returncode is None:   # timed out, or the sync was cancelled: git goes too, and its
                # helpers (git-remote-https holds git's pipes, and the wait ends once they close)
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)   # its own group: start_new_session
                await proc.wait()
        if check and proc.returncode != 0:
            lines = err.decode(errors="replace").strip().splitlines()
            raise GitError(f"git {args[0]}: " + (" ".join(lines[-3:]) or f"exit status {proc.returncode}"))
        return out.decode(errors="replace")


def _inside(path: Path, top: Path, what: str) -> Path:
    """`path` with its links resolved, if that is inside `top` (its links resolved too); GitError if not."""
    real = path.resolve()
    if not real.is_relative_to(top.resolve()):
        raise GitError(f"{what}: outside {top}, where the controller-manager confines it")
    return real


def _environment(url: str, secret_file: str | None) -> dict[str, str]:
    """git's environment: never a prompt; the secret file's token or key given by environment (not argv,
    which every user of the host can read)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
    env.update(GIT_TERMINAL_PROMPT="0", GIT_SSH_COMMAND="ssh -o BatchMode=yes")
    if secret_file is None:
        return env
    if url.startswith("ssh://"):
        if not os.access(secret_file, os.R_OK):
            raise GitError(f"secretRef.file {secret_file}: cannot be read")
        env["GIT_SSH_COMMAND"] = f"ssh -o BatchMode=yes -o IdentitiesOnly=yes -i {shlex.quote(secret_file)}"
    elif url.startswith("https://"):
        try:
            token = Path(secret_file).read_text().strip()
        except OSError as err:
            raise GitError(f"secretRef.file {secret_file}: {err.strerror or err}") from None
        env.update(GIT_CONFIG_COUNT="1", GIT_CONFIG_KEY_0="http.extraHeader",
                   GIT_CONFIG_VALUE_0=f"Authorization: Bearer {token}")
    return env

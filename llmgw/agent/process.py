"""Engine processes: start in their own session, identify across pid reuse, signal whole groups.

A process is identified by (pid, start time), the start time being field 22
of /proc/<pid>/stat (clock ticks after boot): a recycled pid has a different
start time, so an agent never adopts or signals a stranger.
"""
from __future__ import annotations

import asyncio
import os
import signal
from collections import deque
from pathlib import Path

PROC = Path("/proc")


def _stat_fields(pid: int) -> list[str] | None:
    """Fields of /proc/<pid>/stat after the command name (state is [0], pgrp [2], starttime [19])."""
    try:
        raw = (PROC / str(pid) / "stat").read_text()
    except (OSError, ValueError):
        return None
    # The command name is in parentheses and may contain spaces or ')': split at the last one.
    return raw[raw.rfind(")") + 2:].split()


def start_time(pid: int) -> int | None:
    fields = _stat_fields(pid)
    return int(fields[19]) if fields else None


def is_alive(pid: int, started: int | None = None) -> bool:
    """Running (not a zombie) and, when `started` is given, the same process as then."""
    fields = _stat_fields(pid)
    if not fields or fields[0] in ("Z", "X"):
        return False
    return started is None or int(fields[19]) == started


def group_members(pgid: int) -> list[int]:
    """Live (non-zombie) processes in process group pgid."""
    return members({pgid})


def members(pgids: set[int]) -> list[int]:
    """Live (non-zombie) processes in any of the process groups `pgids` (one pass over /proc)."""
    found: list[int] = []
    if not pgids:
        return found
    for entry in PROC.iterdir():
        if not entry.name.isdigit():
            continue
        fields = _stat_fields(int(entry.name))
        if fields and fields[0] not in ("Z", "X") and int(fields[2]) in pgids:
            found.append(int(entry.name))
    return found


def signal_group(pgid: int, sig: int) -> bool:
    """Send sig to the whole group; False when the group no longer exists."""
    try:
        os.killpg(pgid, sig)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return False


def exit_description(returncode: int | None) -> tuple[int | None, str]:
    """(exitCode as a shell reports it, words): -9 -> (137, 'killed by signal SIGKILL')."""
    if returncode is None:
        return None, "exited (exit code unknown: it was started by an earlier agent)"
    if returncode < 0:
        sig = -returncode
        try:
            name = signal.Signals(sig).name
        except ValueError:
            name = f"signal {sig}"
        return 128 + sig, f"was killed by signal {name}"
    return returncode, f"exited with code {returncode}"


def tail(path: str | os.PathLike[str], lines: int) -> list[str]:
    """The last `lines` lines of a log file ([] when it cannot be read)."""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - 64 * 1024))
            data = f.read()
    except OSError:
        return []
    text = data.decode("utf-8", "replace")
    return list(deque((ln.rstrip("\r") for ln in text.splitlines()), maxlen=lines))


async def spawn(argv: list[str], env: dict[str, str], log_path: Path, cwd: Path) -> asyncio.subprocess.Process:
    """Start argv in its own session (so it outlives the agent), output appended to log_path."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "ab") as log:  # noqa: ASYNC230 a local file, opened once per start
        return await asyncio.create_subprocess_exec(
            *argv, stdin=asyncio.subprocess.DEVNULL, stdout=log, stderr=asyncio.subprocess.STDOUT,
            env=env, cwd=str(cwd), start_new_session=True,
        )

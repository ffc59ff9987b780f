"""Engine inventory: which configured engine executables exist and can run here.

Reported in Node status (`engines`), so the scheduler never places a shard
where its engine is missing. Versions are read only where that is cheap: the
dist-info directory next to a Python tool's virtual environment, or
`llama-server --version` with a short timeout. The engines llmgw itself runs
(those with no programs of their own: the sim) are always present.
"""
from __future__ import annotations

import os
import re
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

from llmgw.api import EngineInfo
from llmgw.engines.engine import Executable, builtin
from llmgw.engines.engine import executables as programs
from llmgw.version import version


@dataclass
class Inventory:
    # Named as each program reports itself (Executable.reports: its engine's name, or ray for
    # vLLM's Ray launcher), and the engines llmgw runs itself.
    engines: list[EngineInfo] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)   # "vllm: executable file not found: /opt/..."
    configured: dict[str, str] = field(default_factory=dict)  # executable (llama-server, ...) -> path

    def executables(self) -> dict[str, str]:
        """Executable name -> path for the engine renderer: as configured (the shard's preflight
        names a missing one), plus llmgw for the sim engine."""
        out = dict(self.configured)
        launcher = llmgw_launcher()
        if launcher:
            out["llmgw"] = launcher       # else the sim renderer runs `<python> -m llmgw.sim`
        return out

    def names(self) -> set[str]:
        return {e.name for e in self.engines}


def llmgw_launcher() -> str | None:
    """The `llmgw` script installed next to this interpreter, if there is one."""
    candidate = Path(sys.executable).parent / "llmgw"
    return str(candidate) if os.access(candidate, os.X_OK) else None


def llmgw_executable() -> str:
    """What runs llmgw here: the `llmgw` script, else this interpreter (`python -m llmgw...`)."""
    return llmgw_launcher() or sys.executable


def check_executable(path: str) -> str | None:
    """None when path is an executable file; else the reason, naming the path."""
    p = Path(path)
    if not p.exists():
        return f"executable file not found: {path}"
    if p.is_dir():
        return f"is a directory, not an executable file: {path}"
    if not os.access(p, os.X_OK):
        return f"file is not executable: {path}"
    return None


def take_inventory(executables: dict[str, str]) -> Inventory:
    inv = Inventory(configured=dict(executables))
    for name in sorted(executables):
        path = executables[name]
        problem = check_executable(path)
        if problem:
            inv.problems.append(f"{name}: {problem}")
            continue
        program = programs()[name]
        inv.engines.append(EngineInfo(name=program.reports, path=path, version=_version(program, path)))
    inv.engines += [EngineInfo(name=e.name, path=llmgw_executable(), version=version()) for e in builtin()]
    return inv


def _version(program: Executable, path: str) -> str | None:
    if program.distribution:
        return _dist_version(path, program.distribution)
    if program.version_argv:
        return _run_version(path, program.version_argv)
    return None


def _dist_version(path: str, dist: str) -> str | None:
    """Version from <venv>/lib/python*/site-packages/<dist>-<version>.dist-info, if there."""
    venv = Path(os.path.realpath(path)).parent.parent
    pattern = re.compile(rf"^{re.escape(dist)}-([^-]+)\.dist-info$", re.IGNORECASE)
    for site in venv.glob("lib/python*/site-packages"):
        try:
            for entry in site.iterdir():
                m = pattern.match(entry.name)
                if m:
                    return m.group(1)
        except OSError:
            continue
    return None


def _run_version(path: str, argv: tuple[str, ...]) -> str | None:
    """The "version: X" a program prints when run with `argv` (llama-server --version)."""
    try:
        done = subprocess.run([path, *argv], capture_output=True, text=True, timeout=3,
                              stdin=subprocess.DEVNULL)
        out = done.stdout + done.stderr
    except (OSError, subprocess.TimeoutExpired):
        return None
    m = re.search(r"version:\s*(\S+(?:\s*\([0-9a-f]+\))?)", out)
    return m.group(1) if m else None

"""hack/release.sh builds a single-file llmgw that runs on a bare python3.

Builds the artifact for this machine's architecture (wheels come from PyPI, downloaded once into
the cache: tests/fixtures/release.py) and runs it with a plain interpreter, outside the project's
virtualenv and with an empty environment, as a freshly installed node would: the tests share one
PEX_ROOT, which the first run unpacks the artifact into.
"""
from __future__ import annotations

import hashlib
import os
import subprocess
from pathlib import Path

import pytest

from tests.fixtures.release import release_artifact

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def artifact(tmp_path_factory) -> tuple[Path, str]:
    return release_artifact(tmp_path_factory)


@pytest.fixture(scope="module")
def pex_root(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("pexroot")


def run_artifact(pex: Path, py: str, pex_root: Path, tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    env = {"PATH": "/usr/bin:/bin", "PEX_ROOT": str(pex_root)}
    return subprocess.run([py, str(pex), *args], capture_output=True, text=True, env=env,
                          cwd=tmp_path, timeout=300)


def test_release_writes_checksums(artifact):
    pex, _ = artifact
    sums = (pex.parent / "SHA256SUMS").read_text().split()
    assert sums == [hashlib.sha256(pex.read_bytes()).hexdigest(), pex.name]
    assert os.access(pex, os.X_OK)
    assert pex.read_bytes().startswith(b"#!/usr/bin/env python3\n")


def test_artifact_runs_on_plain_python(artifact, pex_root, tmp_path):
    pex, py = artifact
    top = run_artifact(pex, py, pex_root, tmp_path, "--help")
    assert top.returncode == 0, top.stderr[-3000:]
    assert "Usage: llmgw" in top.stdout
    agent = run_artifact(pex, py, pex_root, tmp_path, "agent", "--help")
    assert agent.returncode == 0, agent.stderr[-3000:]
    assert "--config" in agent.stdout


def test_artifact_carries_native_dependencies(artifact, pex_root, tmp_path):
    """The agent's compiled dependencies come from the artifact, not the host."""
    pex, py = artifact
    env = {"PATH": "/usr/bin:/bin", "PEX_ROOT": str(pex_root), "PEX_INTERPRETER": "1"}
    code = ("import pydantic_core, cryptography.x509, aiohttp, yaml, grpc, llmgw\n"
            "for m in (pydantic_core, cryptography, aiohttp, yaml, grpc, llmgw): print(m.__file__)")
    proc = subprocess.run([py, str(pex), "-c", code], capture_output=True, text=True, env=env, timeout=300,
                          cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    files = proc.stdout.split()
    assert len(files) == 6 and all(f.startswith(str(pex_root)) for f in files), files


def test_release_refuses_unknown_architecture(tmp_path):
    proc = subprocess.run(["bash", str(ROOT / "hack" / "release.sh"), "-o", str(tmp_path), "-a", "mips"],
                          capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert proc.returncode == 2
    assert "unknown architecture mips" in proc.stderr


def test_onboarding_recognises_the_artifact(artifact):
    import platform

    from llmgw.onboarding.artifact import inspect
    pex, py = artifact
    version = subprocess.run([py, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
                             capture_output=True, text=True, check=True).stdout.strip()
    art = inspect(pex)
    assert art.machines == {platform.machine()} and art.pythons == {version}
    art.check_runs_on(platform.machine(), version)

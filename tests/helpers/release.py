"""Build the release artifact (hack/release.sh) for this machine once per test process.

    pex, python3 = release_artifact()   # pytest.skip when this machine has no plain python3 3.11+

The artifact carries wheels for the version of a plain python3 outside the
project's virtualenv (/usr/bin/python3 first), the interpreter a node has.
"""
from __future__ import annotations

import atexit
import functools
import os
import platform
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
ARCH = {"x86_64": "amd64", "aarch64": "arm64"}.get(platform.machine())


def plain_python3() -> str | None:
    """A python3 (3.11+) that is not this virtualenv's."""
    for cand in (shutil.which("python3", path="/usr/bin:/bin"), os.path.join(sys.base_prefix, "bin", "python3")):
        if not cand or not os.access(cand, os.X_OK):
            continue
        ok = subprocess.run([cand, "-c", "import sys; print(sys.version_info >= (3, 11))"],
                            capture_output=True, text=True, env={"PATH": "/usr/bin:/bin"})
        if ok.stdout.strip() == "True":
            return cand
    return None


@functools.lru_cache(maxsize=1)
def _build() -> tuple[str | None, str, str]:
    """(artifact, python3, why-not)."""
    if ARCH is None:
        return None, "", f"release artifacts are built for x86_64 and aarch64, not {platform.machine()}"
    py = plain_python3()
    if py is None:
        return None, "", "no plain python3 >= 3.11 outside the virtualenv"
    version = subprocess.run([py, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
                             capture_output=True, text=True, check=True).stdout.strip()
    out = Path(tempfile.mkdtemp(prefix="llmgw-release-"))
    atexit.register(shutil.rmtree, out, True)
    proc = subprocess.run(["bash", str(ROOT / "hack" / "release.sh"), "-o", str(out), "-a", ARCH, "-p", version],
                          capture_output=True, text=True, timeout=900, cwd=ROOT)
    if proc.returncode != 0:
        raise AssertionError(f"hack/release.sh failed:\n{proc.stderr[-4000:]}")
    pexes = list(out.glob(f"llmgw-*-linux-{ARCH}.pex"))
    assert len(pexes) == 1, list(out.iterdir())
    return str(pexes[0]), py, ""


def release_artifact() -> tuple[Path, str]:
    """$LLMGW_TEST_ARTIFACT names a prebuilt artifact to use instead (for quick local re-runs)."""
    prebuilt = os.environ.get("LLMGW_TEST_ARTIFACT")
    if prebuilt:
        py = plain_python3()
        if py is None:
            pytest.skip("no plain python3 >= 3.11 outside the virtualenv")
        return Path(prebuilt), py
    pex, py, why = _build()
    if pex is None:
        pytest.skip(why)
    return Path(pex), py

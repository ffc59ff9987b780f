"""Release artifacts (hack/release.sh): recognise one, and say which machines it runs on.

A node gets llmgw as a release artifact, a single-file PEX that carries every
dependency as platform wheels. The `llmgw` on the operator's own machine is a
console script bound to a local virtualenv: copied to a node it cannot run,
so it is refused here with a pointer to the release script.
"""
from __future__ import annotations

import json
import re
import zipfile
from dataclasses import dataclass
from pathlib import Path

ENTRY_POINT = "llmgw.cli.main:main"
# The `llmgw` script's entry point before it froze objects for a quick exit: artifacts built then.
FORMER_ENTRY_POINTS = ("llmgw.cli.main:cli",)
_WHEEL = re.compile(r"^(?P<name>[^-]+)-(?P<version>[^-]+)(-\d[^-]*)?"
                    r"-(?P<py>[^-]+)-(?P<abi>[^-]+)-(?P<plat>[^-]+)\.whl$")
_MACHINES = ("x86_64", "aarch64")


class ArtifactError(Exception):
    pass


@dataclass(frozen=True)
class Artifact:
    path: Path
    version: str
    machines: frozenset[str]       # x86_64, aarch64: every machine its native wheels cover
    pythons: frozenset[str]        # "3.11", "3.12", ...: CPython versions its native wheels cover

    def check_runs_on(self, machine: str, python: str) -> None:
        """Raise ArtifactError unless the artifact runs on `uname -m` == machine with python `X.Y`."""
        if self.machines and machine not in self.machines:
            raise ArtifactError(f"{self.path} is built for {', '.join(sorted(self.machines))}, "
                                f"but the host is {machine}: use the {_arch(machine)} artifact")
        if self.pythons and python not in self.pythons:
            raise ArtifactError(f"{self.path} carries wheels for CPython {', '.join(sorted(self.pythons))}, "
                                f"but the host's python3 is {python}: rebuild with hack/release.sh -p {python}")


def _arch(machine: str) -> str:
    return {"x86_64": "linux-amd64", "aarch64": "linux-arm64"}.get(machine, machine)


def inspect(path: str | Path) -> Artifact:
    """Read a release artifact's PEX-INFO; ArtifactError if `path` is not one."""
    p = Path(path)
    hint = "build one with hack/release.sh (dist/llmgw-VERSION-linux-ARCH.pex)"
    if not p.is_file():
        raise ArtifactError(f"{p}: no such file; {hint}")
    try:
        with zipfile.ZipFile(p) as zf:
            info = json.loads(zf.read("PEX-INFO"))
    except (zipfile.BadZipFile, KeyError, ValueError):
        raise ArtifactError(f"{p} is not an llmgw release artifact (no PEX-INFO inside; an installed "
                            f"`llmgw` script only runs in its own virtualenv); {hint}") from None
    if info.get("entry_point") not in (ENTRY_POINT, *FORMER_ENTRY_POINTS):
        raise ArtifactError(f"{p} is a PEX of {info.get('entry_point') or info.get('script')!r}, "
                            f"not of llmgw ({ENTRY_POINT}); {hint}")
    version: str | None = None
    machines: set[str] = set()
    pythons: set[str] = set()
    for wheel in info.get("distributions", {}):
        m = _WHEEL.match(wheel)
        if not m:
            continue
        if m["name"] == "llmgw":
            version = m["version"]
        plat = m["plat"]
        if plat == "any":
            continue
        machines.update(mach for mach in _MACHINES if plat.endswith(mach))
        if m["abi"].startswith("cp") and m["abi"] != "abi3":
            tag = m["abi"][2:].rstrip("dmu")
            pythons.add(f"{tag[0]}.{tag[1:]}")
    if version is None:
        raise ArtifactError(f"{p} does not contain the llmgw wheel; {hint}")
    return Artifact(p, version, frozenset(machines), frozenset(pythons))

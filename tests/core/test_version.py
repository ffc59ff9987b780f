"""llmgw's version: pyproject's."""
from __future__ import annotations

import tomllib
from pathlib import Path

from llmgw.version import version

ROOT = Path(__file__).resolve().parents[2]


def test_the_version_is_pyprojects():
    assert version() == tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]



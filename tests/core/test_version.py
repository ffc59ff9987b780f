"""The version skew policy as a function: which component versions run with which servers'."""
from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from llmgw.version import refusal, release, version

ROOT = Path(__file__).resolve().parents[2]


def test_the_version_is_pyprojects():
    assert version() == tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]


def test_release_is_the_major_and_minor():
    assert release("0.2.0") == (0, 2) and release("1.14.3.dev2") == (1, 14) and release("0.3") == (0, 3)
    assert release("fake") is None and release("v1") is None


@pytest.mark.parametrize("component,theirs,servers", [
    ("agent", "1.4.0", "1.4.2"), ("agent", "1.4.9", "1.4.0"),    # one release: patches run together
    ("agent", "1.2.0", "1.4.0"), ("gateway", "1.2.7", "1.4.0"),   # two minors older
    ("controller-manager", "1.3.0", "1.4.0"),
])
def test_within_the_policy(component, theirs, servers):
    assert refusal(component, theirs, servers) is None


@pytest.mark.parametrize("component,theirs,servers,why", [
    ("agent", "1.5.0", "1.4.0", "is newer than the server's: upgrade the servers first"),
    ("gateway", "2.0.0", "1.4.0", "is newer than the server's"),
    ("agent", "1.1.0", "1.4.0", "is more than 2 minor versions older than the server's: upgrade it"),
    ("agent", "0.9.0", "1.0.0", "is more than 2 minor versions older"),   # another major
    ("controller-manager", "1.2.0", "1.4.0", "is more than 1 minor versions older"),
    ("agent", "fake", "1.4.0", "is no release's version"),
])
def test_outside_the_policy_names_both_versions(component, theirs, servers, why):
    message = refusal(component, theirs, servers)
    assert message is not None and why in message
    assert f"{component} version {theirs} " in message and f"server version {servers}" in message


def test_a_server_of_no_release_enforces_nothing():
    assert refusal("agent", "9.0.0", "unknown") is None

"""`llmgw dev up --engine NAME[=PATH]`: which real engines a local cluster's agents get."""
from __future__ import annotations

import click
import pytest
from click.testing import CliRunner

from llmgw.cli.main import cli
from llmgw.cmd.dev import engine_paths


@pytest.fixture
def bindir(tmp_path):
    d = tmp_path / "bin"
    d.mkdir()
    for name in ("llama-server", "vllm"):
        (d / name).write_text("#!/bin/sh\n")
        (d / name).chmod(0o755)
    return d


def test_an_engine_is_found_on_path_or_given_by_path(bindir, monkeypatch):
    monkeypatch.setenv("PATH", str(bindir))
    assert engine_paths(("llamacpp", f"vllm={bindir / 'vllm'}")) == {
        "llama-server": str(bindir / "llama-server"), "vllm": str(bindir / "vllm")}


@pytest.mark.parametrize("value, error", [
    ("tgi", "unknown engine executable 'tgi'"),
    ("ray", "ray is not on PATH: give --engine ray=PATH"),
    ("sglang", "sglang needs =PATH: it is not a program found on PATH"),
    ("vllm=/nonexistent/vllm", "vllm=/nonexistent/vllm: not an executable file"),
])
def test_bad_engines_are_refused_before_anything_starts(bindir, monkeypatch, value, error):
    monkeypatch.setenv("PATH", str(bindir))
    with pytest.raises(click.BadParameter, match=error):
        engine_paths((value,))
    result = CliRunner().invoke(cli, ["dev", "up", "--dir", str(bindir.parent / "dev"), "--engine", value])
    assert result.exit_code == 2 and error in result.output
    assert not (bindir.parent / "dev").exists()

"""Plugins (issue 35): an executable llmgw-NAME on PATH runs as `llmgw NAME ARGS...`, its exit
status and standard streams its own; `llmgw plugin list`. Real executables in temporary folders
on PATH, run by the real `llmgw` script."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

LLMGW = str(Path(sys.executable).parent / "llmgw")


def plugin(folder: Path, name: str, body: str, mode: int = 0o755) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"llmgw-{name}"
    path.write_text(f"#!/bin/sh\n{body}\n")
    path.chmod(mode)
    return path


def run(path: list[Path], *args: str, stdin: str = "", **env: str) -> subprocess.CompletedProcess:
    """The real llmgw with PATH = these folders, then the system's (not the venv's: its
    llmgw-provision-node and llmgw-onboard-node would be plugins too)."""
    full = {**os.environ, "PATH": os.pathsep.join([*map(str, path), "/usr/bin", "/bin"]), **env}
    return subprocess.run([LLMGW, *args], env=full, input=stdin, capture_output=True, text=True, timeout=60)


def test_a_plugin_runs_with_every_argument_and_its_own_exit_status(tmp_path):
    bin_ = tmp_path / "bin"
    path = plugin(bin_, "hello", 'echo "argv0=$0"; echo "args=$*"; read line; echo "stdin=$line"; '
                                 'echo "to stderr" >&2; exit 7')
    out = run([bin_], "hello", "a b", "--help", "-x", "--context", "prod", stdin="piped\n")
    assert out.returncode == 7
    assert out.stdout.splitlines() == [f"argv0={path}", "args=a b --help -x --context prod", "stdin=piped"]
    assert out.stderr == "to stderr\n"
    assert run([bin_], "hello", stdin="x\n").returncode == 7

    # not a plugin and not a command: click's answer, exit 2
    missing = run([bin_], "helo")
    assert missing.returncode == 2 and "No such command 'helo'" in missing.stderr


def test_built_ins_and_earlier_folders_win_and_list_says_so(tmp_path):
    first, second = tmp_path / "first", tmp_path / "second"
    plugin(first, "hello", "echo first")
    shadowed = plugin(second, "hello", "echo second")
    builtin = plugin(first, "version", "echo plugin version")
    inert = plugin(second, "inert", "echo never", mode=0o644)

    assert run([first, second], "hello").stdout == "first\n"
    assert run([first, second], "version").stdout.startswith("llmgw ")   # the built-in
    out = run([first, second], "inert")
    assert out.returncode == 2 and "No such command 'inert'" in out.stderr

    listed = run([first, second], "plugin", "list")
    assert listed.returncode == 0
    assert listed.stdout.splitlines() == [str(first / "llmgw-hello"), str(builtin), str(shadowed), str(inert)]
    assert listed.stderr.splitlines() == [
        f"  warning: {builtin} is shadowed by the built-in command `llmgw version`",
        f"  warning: {shadowed} is shadowed by {first / 'llmgw-hello'}",
        f"  warning: {inert} is not executable",
    ]


def test_plugin_list_without_plugins_is_an_error(tmp_path):
    out = run([tmp_path], "plugin", "list")
    assert out.returncode == 1
    assert out.stderr.strip() == "error: no plugins on PATH (executables named llmgw-NAME)"


def test_plugins_complete_as_commands(tmp_path):
    bin_ = tmp_path / "bin"
    plugin(bin_, "hello", "exit 0")
    plugin(bin_, "help-me", "exit 0", mode=0o644)   # not executable: not offered
    out = run([bin_], _LLMGW_COMPLETE="bash_complete", COMP_WORDS="llmgw he", COMP_CWORD="1")
    assert out.returncode == 0 and out.stdout.splitlines() == ["plain,hello"]

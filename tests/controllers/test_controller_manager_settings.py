"""`llmgw controller-manager`'s settings: a flag for every field of ControllerSettings, a --config YAML
file of the same names (the flags override it), and bad input refused in one line, exit status 2."""
from __future__ import annotations

import asyncio
import subprocess
import sys

import pytest
from click.testing import CliRunner

from controllers.settings import ControllerSettings
from llmgw.api import EVICTING, Node, get_condition
from llmgw.cmd import controller_manager as cli
from tests.fixtures.ctrlkit import node
from tests.fixtures.poll import until

ETCD = ["--etcd", "http://127.0.0.1:1"]
FLAGS = {name: "--" + name.replace("_", "-") for name in ControllerSettings.model_fields}


@pytest.fixture
def start(monkeypatch):
    """Runs the command line in-process up to where it would connect to etcd; returns the settings it built."""
    started: list[ControllerSettings] = []

    def run(main):
        started.append(main.cr_frame.f_locals["settings"])
        main.close()
    monkeypatch.setattr(cli.aio, "run", run)

    def invoke(*args: str) -> ControllerSettings:
        out = CliRunner().invoke(cli.controller_manager, [*ETCD, *args])
        assert out.exit_code == 0, out.output
        return started.pop()
    return invoke


def refused(*args: str) -> str:
    """The command's output when it refuses its arguments (exit status 2, no traceback)."""
    out = CliRunner().invoke(cli.controller_manager, [*ETCD, *args])
    assert out.exit_code == 2, out.output
    assert "Traceback" not in out.output and isinstance(out.exception, SystemExit), out.exception
    return out.output


def config(tmp_path, text: str) -> str:
    path = tmp_path / "controllers.yaml"
    path.write_text(text)
    return str(path)


def test_no_flags_give_the_defaults(start):
    assert start() == ControllerSettings()


@pytest.mark.parametrize("name", list(ControllerSettings.model_fields))
def test_every_setting_has_a_flag(start, name):
    default = getattr(ControllerSettings(), name)
    value = (f"/srv/{name}" if isinstance(default, str) else default * 3 if isinstance(default, int)
             else 0.25 if name == "max_silent_fraction" else default + 2.5)
    got = start(FLAGS[name], str(value))
    assert getattr(got, name) == value
    assert got == ControllerSettings(**{name: value})        # and nothing else moved


def test_the_disruption_budget_is_set_from_the_command_line(start):
    got = start("--node-grace", "12", "--max-silent-fraction", "0.4", "--eviction-settle", "90",
                "--eviction-rate", "0.5")
    assert (got.node_grace, got.max_silent_fraction, got.eviction_settle, got.eviction_rate) == (12, 0.4, 90, 0.5)
    assert "--eviction-rate" in refused("--eviction-rate", "0")


def test_a_config_file_sets_what_it_names_and_a_flag_overrides_it(start, tmp_path):
    path = config(tmp_path, "node_grace: 45\ncompact_keep: 500\nscheduler_retry: 2.5\n")
    assert start("--config", path) == ControllerSettings(node_grace=45, compact_keep=500, scheduler_retry=2.5)
    got = start("--config", path, "--node-grace", "7")
    assert got == ControllerSettings(node_grace=7, compact_keep=500, scheduler_retry=2.5)
    assert start("--config", config(tmp_path, "# nothing set\n")) == ControllerSettings()


def test_a_misspelt_setting_in_the_file_is_refused_naming_the_file_and_the_key(tmp_path):
    path = config(tmp_path, "node_grace: 45\nnode_grcae: 60\n")
    assert refused("--config", path) == f"Error: {path}: unknown setting 'node_grcae' (did you mean node_grace?)\n"
    path = config(tmp_path, "node-grace: 60\n")                      # the flag's spelling, not the key's
    assert "unknown setting 'node-grace' (did you mean node_grace?)" in refused("--config", path)


@pytest.mark.parametrize("text, why", [
    ("eviction_rate: 0\n", "eviction_rate: Input should be greater than 0 (got 0)"),
    ("max_silent_fraction: 2\n", "max_silent_fraction: Input should be less than or equal to 1 (got 2)"),
    ("compact_keep: many\n", "compact_keep: Input should be a valid integer, unable to parse string as an integer"),
    ("node_grace: [1, 2]\n", "node_grace: Input should be a valid number"),
    ("- node_grace\n- 30\n", "expected a mapping of setting names to values"),
    ("30\n", "expected a mapping of setting names to values"),
    ("node_grace: [1\n", "not YAML: expected ',' or ']'"),
])
def test_a_bad_value_or_file_is_one_line_naming_the_file_and_the_key(tmp_path, text, why):
    path = config(tmp_path, text)
    out = refused("--config", path)
    assert out.startswith(f"Error: {path}: {why}") and out.count("\n") == 1, out


def test_a_bad_value_in_the_file_is_refused_even_when_a_flag_overrides_it(tmp_path):
    """The file is the operator's: a mistake in it is worth hearing about, whatever the flags say."""
    path = config(tmp_path, "node_grace: -1\n")
    assert refused("--config", path, "--node-grace", "5").startswith(f"Error: {path}: node_grace: ")


def test_a_missing_config_file_is_a_usage_error():
    assert "does not exist" in refused("--config", "/nonexistent/controllers.yaml")


def test_help_shows_each_setting_with_its_description_and_default():
    out = CliRunner().invoke(cli.controller_manager, ["--help"], terminal_width=1000)
    assert out.exit_code == 0
    lines = out.output.splitlines()
    for name, field in ControllerSettings.model_fields.items():
        (line,) = [ln for ln in lines if ln.strip().startswith(FLAGS[name] + " ")]
        shown = f"[default: {field.default}" + (";" if field.annotation is not str else "")   # a number's range
        assert field.description in line and shown in line, line
    assert "--config FILE" in out.output


def test_each_controller_gets_the_settings_it_reads():
    settings = ControllerSettings(node_grace=1.5, scheduler_retry=9)
    built = cli.controllers(settings)
    assert {c.name for c in built} == {"model", "replica", "scheduler", "nodelifecycle", "drain", "gc",
                                         "autoscaler", "gitops", "adapter"}
    assert all(c.settings is settings for c in built if hasattr(c, "settings"))
    assert [c.name for c in built if not hasattr(c, "settings")] == ["model", "gc"]     # they read none


async def test_the_real_command_runs_the_controllers_with_the_files_settings_and_the_flags_over_them(etcd, store,
                                                                                                   tmp_path):
    """A silent node is judged lost after `node_grace`: 3600 s in the file, 0.5 s on the command line."""
    await store.create(node("n1"))                    # registered, never a heartbeat: silent from the start
    path = config(tmp_path, "node_grace: 3600\n")
    proc = subprocess.Popen([sys.executable, "-m", "llmgw.cli.main", "controller-manager", "--etcd", etcd.endpoint,
                             "--metrics-listen", "", "--config", path, "--node-grace", "0.5"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        async def verdict():
            n = await store.get(Node, "n1")
            c = get_condition(n.status.conditions, EVICTING)
            return c if c is not None and c.status == "True" else None
        lost = await until(verdict, what="n1 judged lost")
        assert "(grace 0.5s)" in lost.message
    finally:
        proc.terminate()
        _, err = await asyncio.to_thread(proc.communicate, timeout=30)
    assert "Traceback" not in err, err

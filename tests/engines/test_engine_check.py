"""`llmgw ctl engine-check` against help texts in each engine's real format, printed by stand-in programs.

The stand-ins are small shell scripts that print the fixtures in tests/fixtures/data/help/
when called the way the real program would be (`vllm serve --help=all` with
VLLM_TARGET_DEVICE=cpu, `ray start --help`, ...): faking only the engines
themselves, which this machine does not have. vllm-0.11-all.txt and
sglang-launch-server.txt are excerpts of the captured help; their
--prefix-caching-hash-algo, --kv-events-config (vLLM) and --kv-events-config
(SGLang) entries were written from the released wheels' source (vLLM 0.34.0's
CacheConfig and VllmConfig field docs, SGLang 0.5.23's observability fields),
as neither prints its help without torch, which this machine cannot install.
The LoRA entries (vLLM's LoRAConfig group: --enable-lora/--no-enable-lora,
--max-loras, --max-lora-rank, --max-cpu-loras; SGLang's --enable-lora,
--max-lora-rank, --lora-paths, --max-loaded-loras, --max-loras-per-batch) and
SGLang's --page-size were printed by argparse (Python 3.11, COLUMNS=80; vLLM's
ArgumentDefaultsHelpFormatter) from each flag's definition as read in the wheels
from `pip download --no-deps vllm==0.11.1 sglang==0.5.23` (0.11.1: the first
with --nnodes, which the capture has): vLLM's engine/arg_utils.py and
config/lora.py (name, action, type, choices, default and the field's
docstring), SGLang's arg_groups/fields/lora.py and schedule.py through
arg_groups/arg_utils.py's mapping of a field to its argparse argument.
"""
from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from llmgw.cli.main import cli
from llmgw.engines.helptext import documented_flags, is_documented, used_flags

HELP = Path(__file__).parents[1] / "fixtures" / "data" / "help"
CAT = shutil.which("cat")
ROW = re.compile(r"^\s*(\S+)\s+(-\S+)\s+(found|missing|skipped)\b", re.M)

VLLM_FLAGS_MP = ["--host", "--port", "--served-model-name", "--enable-lora", "--max-loras", "--kv-events-config",
                 "--prefix-caching-hash-algo",
                 "--tensor-parallel-size", "--pipeline-parallel-size", "--gpu-memory-utilization", "--nnodes",
                 "--node-rank", "--master-addr", "--master-port", "--headless"]
RAY_FLAGS = ["--head", "--port", "--node-ip-address", "--num-gpus", "--block", "--address"]


def script(path: Path, body: str) -> Path:
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(0o755)
    return path


@pytest.fixture
def bindir(tmp_path) -> Path:
    d = tmp_path / "bin"
    d.mkdir()
    return d


def fake_vllm(bindir: Path) -> Path:
    """vLLM >= 0.11: the summary for --help, every flag for --help=all; no accelerator unless told 'cpu'."""
    return script(bindir / "vllm", f"""
if [ "$1" = serve ] && [ "$2" = "--help=all" ]; then
  if [ "$VLLM_TARGET_DEVICE" != cpu ]; then echo "RuntimeError: Failed to infer device type" >&2; exit 1; fi
  exec {CAT} {HELP / 'vllm-0.11-all.txt'}
fi
if [ "$1" = serve ] && [ "$2" = "--help" ]; then exec {CAT} {HELP / 'vllm-0.11-summary.txt'}; fi
echo "vllm: unexpected arguments: $*" >&2; exit 2
""")


def fake_ray(bindir: Path, lines: int | None = None) -> Path:
    show = f"{shutil.which('head')} -n {lines}" if lines else CAT
    return script(bindir / "ray", f"""
if [ "$1" = start ] && [ "$2" = --help ]; then exec {show} {HELP / 'ray-start.txt'}; fi
echo "ray: unexpected arguments: $*" >&2; exit 2
""")


def run(*args: str, path: Path | None = None):
    env = {"PATH": str(path)} if path is not None else None
    result = CliRunner().invoke(cli, ["ctl", "engine-check", *args], env=env)
    rows = {(p, f): s for p, f, s in ROW.findall(result.stdout)}
    return result, rows


# ------------------------------------------------------------------- vLLM

def test_vllm_mp_against_the_full_listing(bindir):
    result, rows = run("vllm", "--executable", str(fake_vllm(bindir)), path=bindir)
    assert result.exit_code == 0, result.output
    assert {f: rows[("vllm", f)] for f in VLLM_FLAGS_MP} == dict.fromkeys(VLLM_FLAGS_MP, "found")
    assert "15 flags: 15 found, 0 missing, 0 skipped" in result.output
    assert "warning" not in result.output


def test_vllm_summary_finds_every_flag_missing_and_says_why(bindir):
    result, rows = run("vllm", "--help-file", str(HELP / "vllm-0.11-summary.txt"), path=bindir)
    assert result.exit_code == 1
    assert {f: rows[("vllm", f)] for f in VLLM_FLAGS_MP} == dict.fromkeys(VLLM_FLAGS_MP, "missing")
    assert "vllm serve --help=all" in result.stderr


def test_vllm_full_listing_given_as_text(bindir):
    text = (HELP / "vllm-0.11-all.txt").read_text()
    result, rows = run("vllm", "--help-output", text, path=bindir)
    assert result.exit_code == 0, result.output
    assert set(rows.values()) == {"found"}


def test_vllm_before_multi_node_mp_lacks_its_flags(bindir):
    new = ("  --nnodes", "  --node-rank", "  --master-addr", "  --master-port")
    text = "\n".join(line for line in (HELP / "vllm-0.11-all.txt").read_text().splitlines()
                     if not line.startswith(new))
    result, rows = run("vllm", "--help-output", text, path=bindir)
    assert result.exit_code == 1
    missing = sorted(f for (_, f), s in rows.items() if s == "missing")
    assert missing == ["--master-addr", "--master-port", "--nnodes", "--node-rank"]
    assert rows[("vllm", "--headless")] == "found"



@pytest.mark.parametrize("engine, help_file, lora", [
    ("vllm", "vllm-0.11-all.txt", ["--enable-lora", "--max-loras"]),
    ("sglang", "sglang-launch-server.txt", ["--enable-lora", "--max-loaded-loras", "--max-loras-per-batch"]),
])
def test_the_lora_flags_a_renderer_emits_are_checked(bindir, engine, help_file, lora):
    """The widest render takes LoRA adapters (a Model's spec.adapters): a help without them misses exactly those."""
    text = "\n".join(line for line in (HELP / help_file).read_text().splitlines()
                     if not line.startswith(tuple(f"  {f}" for f in lora)))
    result, rows = run(engine, "--help-output", text, path=bindir)
    assert result.exit_code == 1
    assert sorted(f for (_, f), s in rows.items() if s == "missing") == sorted(lora)

def test_vllm_0_10_without_help_all_is_checked_against_its_full_help(bindir, tmp_path):
    new = ("  --nnodes", "  --node-rank", "  --master-addr", "  --master-port")
    listing = tmp_path / "vllm-0.10.txt"  # 0.10 printed every flag for --help, and had no mp multi-node yet
    listing.write_text("\n".join(line for line in (HELP / "vllm-0.11-all.txt").read_text().splitlines()
                                 if not line.startswith(new)))
    vllm = script(bindir / "vllm", f"""
if [ "$1" = serve ] && [ "$2" = --help ]; then exec {CAT} {listing}; fi
echo "usage: vllm serve [model_tag] [options]"
echo "vllm serve: error: argument -h/--help: ignored explicit argument 'all'"; exit 2
""")
    result, rows = run("vllm", "--executable", str(vllm), path=bindir)
    assert result.exit_code == 1
    assert sorted(f for (_, f), s in rows.items() if s == "missing") == [
        "--master-addr", "--master-port", "--nnodes", "--node-rank"]
    assert "checked against" in result.stderr and "serve --help` instead" in result.stderr


def test_vllm_ray_checks_ray_flags_against_ray_start(bindir):
    fake_ray(bindir)
    result, rows = run("vllm", "--launch-mode", "ray", "--executable", str(fake_vllm(bindir)), path=bindir)
    assert result.exit_code == 0, result.output
    assert {f: rows[("ray", f)] for f in RAY_FLAGS} == dict.fromkeys(RAY_FLAGS, "found")
    assert rows[("vllm", "--distributed-executor-backend")] == "found"
    assert ("vllm", "--headless") not in rows  # ray ranks >= 1 never run vllm


def test_ray_not_installed_is_skipped_not_failed(bindir):
    result, rows = run("vllm", "--launch-mode", "ray", "--executable", str(fake_vllm(bindir)), path=bindir)
    assert result.exit_code == 0, result.output
    assert {f: rows[("ray", f)] for f in RAY_FLAGS} == dict.fromkeys(RAY_FLAGS, "skipped")
    assert "ray: skipped, not installed: ray not found" in result.stderr


def test_truncated_ray_help_misses_flags_and_warns(bindir):
    fake_ray(bindir, lines=40)  # click lists --help last: a cut-off help lacks it
    result, rows = run("vllm", "--launch-mode", "ray", "--executable", str(fake_vllm(bindir)), path=bindir)
    assert result.exit_code == 1
    assert rows[("ray", "--port")] == "found"
    assert (rows[("ray", "--head")], rows[("ray", "--block")], rows[("ray", "--num-gpus")]) == ("missing",) * 3
    assert "ray: the help text does not document --help itself" in result.stderr


def test_an_engine_that_is_not_on_path_is_skipped(bindir):
    result, rows = run("vllm", path=bindir)
    assert result.exit_code == 0
    assert set(rows.values()) == {"skipped"} and len(rows) == len(VLLM_FLAGS_MP)
    assert "not installed" in result.output


@pytest.mark.parametrize("engine, name", [("vllm", "vllm"), ("llamacpp", "llama-server"), ("sglang", "python3")])
def test_a_named_executable_that_is_not_there_fails(bindir, engine, name):
    missing = str(bindir / "missing" / name)
    result, rows = run(engine, "--executable", missing, path=bindir)
    assert result.exit_code == 1
    assert f"error: {'llama-server' if engine == 'llamacpp' else engine}: --executable {missing}: not installed" \
        in result.stderr
    assert set(rows.values()) == {"skipped"}


def test_a_named_executable_that_cannot_be_executed_fails(bindir):
    plain = bindir / "llama-server"
    plain.write_text("not a program")
    result, _ = run("llamacpp", "--executable", str(plain), path=bindir)
    assert result.exit_code == 1
    assert "cannot run" in result.stderr


def test_a_program_that_fails_instead_of_printing_help_is_skipped(bindir):
    broken = script(bindir / "vllm", 'echo "RuntimeError: Failed to infer device type" >&2; exit 1\n')
    result, rows = run("vllm", "--executable", str(broken), path=bindir)
    assert result.exit_code == 0
    assert set(rows.values()) == {"skipped"}
    assert "exited with status 1: RuntimeError: Failed to infer device type" in result.stderr


# ---------------------------------------------------- llama.cpp, SGLang, sim

def test_llama_server_long_help_is_read_to_the_end(bindir):
    llama = script(bindir / "llama-server", f"""
echo "load_backend: loaded CPU backend from /usr/lib/libggml-cpu-haswell.so" >&2
if [ "$1" = --help ]; then exec {CAT} {HELP / 'llama-server.txt'}; fi
exit 1
""")
    result, rows = run("llamacpp", "--executable", str(llama), path=bindir)
    assert result.exit_code == 0, result.output
    flags = ["--model", "--host", "--port", "--metrics", "--alias", "--parallel", "--n-gpu-layers", "--ctx-size",
             "--lora-init-without-apply", "--lora"]
    assert {f: rows[("llama-server", f)] for f in flags} == dict.fromkeys(flags, "found")


def test_sglang(bindir):
    python = script(bindir / "python3", f"""
if [ "$1" = -m ] && [ "$2" = sglang.launch_server ] && [ "$3" = --help ]; then
  exec {CAT} {HELP / 'sglang-launch-server.txt'}
fi
exit 1
""")
    result, rows = run("sglang", "--executable", str(python), path=bindir)
    assert result.exit_code == 0, result.output
    flags = ["--model-path", "--host", "--port", "--served-model-name", "--tp-size", "--enable-metrics",
             "--enable-lora", "--max-loaded-loras", "--max-loras-per-batch", "--max-total-tokens", "--kv-events-config",
             "--nnodes", "--node-rank", "--dist-init-addr", "--page-size"]
    assert {f: rows[("sglang", f)] for f in flags} == dict.fromkeys(flags, "found")


def test_sim_flags_match_the_real_sim_help():
    result, rows = run("sim")  # runs `python -m llmgw.sim --help` for real
    assert result.exit_code == 0, result.output
    assert rows == dict.fromkeys(
        [("sim", f) for f in ("--host", "--port", "--served-model-name", "--rank", "--world-size",
                              "--dist-init-addr", "--model", "--enable-lora", "--max-loras", "--kv-events-config")],
        "found")


def test_usage_errors(bindir):
    result, _ = run("sglang", "--launch-mode", "ray")
    assert result.exit_code == 2 and "--launch-mode ray: engine sglang has no launch modes" in result.output
    result, _ = run("vllm", "--launch-mode", "slurm")
    assert result.exit_code == 2 and "--launch-mode slurm: engine vllm has the launch modes mp, ray" in result.output
    result, _ = run("vllm", "--help-output", "x", "--help-file", str(HELP / "ray-start.txt"))
    assert result.exit_code == 2 and "not both" in result.output


# ----------------------------------------------------- flag forms (pure)

def test_documented_flags_reads_option_lines_in_every_layout():
    text = """\
usage: prog [-h] [--in-usage X]

Prose mentioning --not-an-option and --help=all documents nothing.
  --long-only VALUE     description that names --also-not-an-option
  --tensor-parallel-size N, -tp N
                        continuation line naming --nor-this
  --enable-x, --no-enable-x
  --[no-]color          click's negatable form
  --head / --no-head    click's boolean pair
-ngl,  --gpu-layers, --n-gpu-layers N   llama.cpp's layout
--fit [on|off]                          optional value
  --opt=VALUE           the = form
"""
    assert documented_flags(text) == {
        "--long-only", "--tensor-parallel-size", "-tp", "--enable-x", "--no-enable-x", "--color", "--no-color",
        "--head", "--no-head", "-ngl", "--gpu-layers", "--n-gpu-layers", "--fit", "--opt",
    }


def test_used_flags_takes_flag_equals_value_and_skips_values():
    argv = ["--port=30002", "--seed", "-1", "-tp", "8", "--block", "--port", "1", "--compilation-config.level", "3"]
    assert used_flags(argv) == ["--port", "--seed", "-tp", "--block", "--compilation-config.level"]


def test_a_dotted_json_flag_is_documented_by_its_base():
    assert is_documented("--compilation-config.level", {"--compilation-config"})
    assert not is_documented("--nnodes", {"--nnodes-x", "-n"})

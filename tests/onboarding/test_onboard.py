"""llmgw-onboard-node against a real sshd on loopback, a real server and a real release artifact.

The "remote" host is this machine, reached over ssh as root; everything is
installed under a throwaway --root, the trust store update runs on that
root's copy, and the agent runs under `--service-manager direct` (no systemd
here). Needs Debian's openssh-server (skipped, saying so, without it).
"""
from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from cryptography import x509

from llmgw.api import Node
from llmgw.pki import identity_from_pem_file
from tests.fixtures.cluster import api_server, ca_dir  # noqa: F401
from tests.fixtures.poll import until_sync
from tests.fixtures.release import release_artifact
from tests.fixtures.sshd import start_sshd

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = Path(sys.executable).with_name("llmgw-onboard-node")
FAKE_SMI = ROOT / "hack" / "fakes" / "nvidia-smi"

pytestmark = pytest.mark.timeout(600)


@pytest.fixture
def sshd(tmp_path):
    server = start_sshd(tmp_path / "sshd")       # skips here when sshd cannot run
    yield server
    server.stop()


class Onboarding:
    def __init__(self, tmp_path: Path, sshd, api_server, artifact: Path):
        self.tmp, self.sshd, self.api, self.artifact = tmp_path, sshd, api_server, artifact
        self.root = tmp_path / "hostroot"
        self.root.mkdir()
        self.ib = tmp_path / "ib"
        subprocess.run([sys.executable, str(ROOT / "hack" / "fakes" / "make_sysfs.py"), str(self.ib),
                        "mlx5_0", "mlx5_1"], check=True)
        self.client_config = tmp_path / "client.yaml"
        cert, key = api_server.admin
        self.client_config.write_text(yaml.safe_dump(
            {"server": api_server.url, "ca": api_server.ca, "cert": cert, "key": key}))

    def run(self, node: str, *extra: str, server: str | None = None, wait: str = "120") -> subprocess.CompletedProcess:
        argv = [str(SCRIPT)] if SCRIPT.exists() else \
            [sys.executable, "-c", "from llmgw.cmd.onboard import main; main()"]
        argv += ["--node", node, "--addr", "127.0.0.1", "--server", server or self.api.url,
                 "--ssh-port", str(self.sshd.port), "--ssh-identity", self.sshd.identity,
                 "--ssh-known-hosts", self.sshd.known_hosts, "--ca-dir", str(self.api.pki.dir),
                 "--binary", str(self.artifact), "--root", str(self.root), "--service-manager", "direct",
                 "--nvidia-smi", str(FAKE_SMI), "--ib-root", str(self.ib), "--fabric", "ib-a",
                 "--logs-listen", "127.0.0.1:0",   # any free port: the machine is shared
                 "--config", str(self.client_config), "--wait", wait, *extra]
        env = {**os.environ, "HOME": str(self.tmp)}
        env.pop("LLMGW_INSTALL_ROOT", None)
        return subprocess.run(argv, capture_output=True, text=True, env=env, timeout=400)

    def path(self, rel: str) -> Path:
        return self.root / rel

    def agent_pid(self) -> int | None:
        pidfile = self.path("run/llmgw-agent.pid")
        if not pidfile.exists():
            return None
        pid = int(pidfile.read_text())
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return None
        return pid

    def snapshot(self) -> dict[str, tuple[int, int]]:
        """(mtime_ns, inode) of every file onboarding installs."""
        out = {}
        for base in ("etc", "usr"):
            for p in sorted(self.path(base).rglob("*")):
                if p.is_file() and not p.is_symlink():
                    st = p.stat()
                    out[str(p.relative_to(self.root))] = (st.st_mtime_ns, st.st_ino)
        return out

    def stop_agent(self) -> None:
        pid = self.agent_pid()
        if pid:
            os.kill(pid, signal.SIGTERM)
            for _ in range(100):
                try:
                    os.kill(pid, 0)
                except ProcessLookupError:
                    return
                time.sleep(0.1)
            os.kill(pid, signal.SIGKILL)


@pytest.fixture
def onboarding(sshd, api_server, tmp_path, tmp_path_factory):
    pex, _python = release_artifact(tmp_path_factory)
    ob = Onboarding(tmp_path, sshd, api_server, pex)
    yield ob
    ob.stop_agent()


def get_node(api_server, name: str):
    async def go():
        async with api_server.client() as c:
            return await c.get(Node, name)
    return asyncio.run(go())


def test_onboard_installs_agent_that_registers_and_rerun_changes_nothing(onboarding, api_server):
    first = onboarding.run("gpu-e2e")
    print(first.stdout, first.stderr)
    assert first.returncode == 0, first.stdout + first.stderr
    out = first.stdout
    assert "certificate: CN=gpu-e2e" in out and "issued now" in out
    for rel in ("usr/local/bin/llmgw", "etc/llmgw/pki/ca.crt", "etc/llmgw/pki/node.crt", "etc/llmgw/pki/node.key",
                "etc/llmgw/agent.yaml", "etc/systemd/system/llmgw-agent.service",
                "usr/local/share/ca-certificates/llmgw-ca.crt"):
        assert f"installed  {onboarding.path(rel)}" in out, rel
    assert "agent (direct): started (pid" in out

    # identity: CN = node id, the key private, the root trusted in the (sandboxed) system store
    ident = identity_from_pem_file(str(onboarding.path("etc/llmgw/pki/node.crt")))
    assert (ident.name, ident.org) == ("gpu-e2e", "llmgw:nodes")
    assert onboarding.path("etc/llmgw/pki/node.key").stat().st_mode & 0o777 == 0o600
    assert onboarding.path("usr/local/bin/llmgw").stat().st_mode & 0o777 == 0o755
    ca_pem = Path(api_server.ca).read_bytes()
    bundle = onboarding.path("etc/ssl/certs/ca-certificates.crt").read_bytes()
    assert x509.load_pem_x509_certificate(ca_pem) in x509.load_pem_x509_certificates(bundle)
    assert os.readlink(onboarding.path("etc/ssl/certs/llmgw-ca.pem")).endswith("llmgw-ca.crt")

    # configuration and unit point at the installed files
    cfg = yaml.safe_load(onboarding.path("etc/llmgw/agent.yaml").read_text())
    assert cfg == {"node": "gpu-e2e", "server": api_server.url,
                   "ca": str(onboarding.path("etc/llmgw/pki/ca.crt")),
                   "cert": str(onboarding.path("etc/llmgw/pki/node.crt")),
                   "key": str(onboarding.path("etc/llmgw/pki/node.key")),
                   "fabrics": ["ib-a"], "nvidia-smi": str(FAKE_SMI), "ib-root": str(onboarding.ib),
                   "logs-listen": "127.0.0.1:0", "state-dir": str(onboarding.path("var/lib/llmgw/agent"))}
    unit = onboarding.path("etc/systemd/system/llmgw-agent.service").read_text()
    assert f"ExecStart={onboarding.path('usr/local/bin/llmgw')} agent --config " \
           f"{onboarding.path('etc/llmgw/agent.yaml')}" in unit
    assert "KillMode=process" in unit

    # the installed agent really runs, and its Node is in the server; the row was printed
    pid = onboarding.agent_pid()
    assert pid is not None
    cmdline = Path(f"/proc/{pid}/cmdline").read_text().split("\0")
    # the artifact re-executes itself from its unpacked virtualenv under PEX_ROOT
    assert cmdline[0].startswith(str(onboarding.path("var/lib/llmgw/pex")))
    assert cmdline[-4:] == ["agent", "--config", str(onboarding.path("etc/llmgw/agent.yaml")), ""]
    node = get_node(api_server, "gpu-e2e")
    assert node.metadata.name == "gpu-e2e"
    row = [ln for ln in out.splitlines() if ln.startswith("gpu-e2e ")]
    assert row and "NAME" in out
    node = until_sync(lambda: (n := get_node(api_server, "gpu-e2e")).status.fabrics and n.status.gpus
                      and n.status.agentEndpoint and n,
                      "the agent to report its fabrics, GPUs and log endpoint", timeout=30, interval=0.5)
    assert [f.name for f in node.status.fabrics] == ["ib-a"]
    assert len(node.status.gpus) == 8
    assert node.status.agentEndpoint.startswith("https://")   # it serves its engines' logs (`llmgw logs`)

    # a second run changes nothing: same certificate, no file written, the agent not restarted
    before = onboarding.snapshot()
    serials = [e for e in api_server.pki.dir.joinpath("index.json").read_text().split('"serial"')]
    second = onboarding.run("gpu-e2e")
    print(second.stdout, second.stderr)
    assert second.returncode == 0, second.stdout + second.stderr
    assert "already issued" in second.stdout
    assert "installed" not in second.stdout and "trusted" not in second.stdout
    assert f"agent (direct): running (pid {pid}), unchanged" in second.stdout
    assert onboarding.snapshot() == before
    assert onboarding.agent_pid() == pid
    assert api_server.pki.dir.joinpath("index.json").read_text().split('"serial"') == serials
    assert "gpu-e2e " in second.stdout

    # the host now belongs to gpu-e2e: onboarding it as another node is refused, naming the CN
    other = onboarding.run("gpu-other")
    print(other.stdout, other.stderr)
    assert other.returncode == 1
    assert "already another node" in other.stderr and "CN='gpu-e2e'" in other.stderr
    assert "Refusing to make it 'gpu-other'" in other.stderr
    assert '"gpu-other"' not in api_server.pki.dir.joinpath("index.json").read_text()   # nothing issued
    assert onboarding.snapshot() == before and onboarding.agent_pid() == pid


def test_certificate_with_wrong_cn_is_refused(onboarding, api_server):
    cert, key = api_server.issue_node("gpu-a")
    res = onboarding.run("gpu-b", "--cert", cert, "--key", key)
    assert res.returncode == 1
    assert "CN='gpu-a', but the node is 'gpu-b'" in res.stderr
    assert not any(onboarding.root.iterdir())          # nothing reached the host


def test_timeout_says_why_and_where_to_look(onboarding, api_server):
    # the agent starts, but its server URL leads nowhere
    dead = "https://127.0.0.1:9"
    res = onboarding.run("gpu-lost", server=dead, wait="3")   # a wait that ends, however short
    print(res.stdout, res.stderr)
    assert res.returncode == 1
    err = res.stderr
    assert f"node gpu-lost did not appear in {dead} within 3s" in err
    assert "Likely causes" in err and "the server's log says why" in err
    assert str(onboarding.path("var/log/llmgw-agent.log")) in err
    assert onboarding.agent_pid() is not None


# ------------------------------------------------------------ without sshd

def test_rendered_unit_keeps_the_reference_units_service_settings():
    """The unit onboarding writes matches deploy/systemd/llmgw-agent.service (paths aside)."""
    from llmgw.onboarding.remote_install import Layout, render_unit

    def directives(text: str) -> dict[str, str]:
        return dict(ln.split("=", 1) for ln in text.splitlines() if "=" in ln and not ln.startswith("#"))

    reference = directives((ROOT / "deploy" / "systemd" / "llmgw-agent.service").read_text())
    rendered = directives(render_unit(Layout("/")).decode())
    for key in ("KillMode", "ExecStart", "Restart", "StateDirectory", "LimitNOFILE", "LimitMEMLOCK", "WantedBy"):
        assert rendered[key] == reference[key], key
    assert rendered["Environment"] == "PEX_ROOT=/var/lib/llmgw/pex"


def _fake_pex(path: Path, wheels: list[str], entry_point: str = "llmgw.cli.main:main") -> Path:
    import json
    import zipfile
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr("PEX-INFO", json.dumps({"entry_point": entry_point, "distributions": dict.fromkeys(wheels, "x")}))
    return path


def test_artifact_platforms_are_read_from_its_wheels(tmp_path):
    from llmgw.onboarding.artifact import ArtifactError, inspect
    wheels = ["llmgw-0.3.1-py3-none-any.whl", "click-8.1.0-py3-none-any.whl",
              "pydantic_core-2.1-cp311-cp311-manylinux2014_aarch64.manylinux_2_17_aarch64.whl",
              "pydantic_core-2.1-cp312-cp312-manylinux2014_aarch64.manylinux_2_17_aarch64.whl",
              "cryptography-50-cp311-abi3-manylinux2014_aarch64.whl"]
    art = inspect(_fake_pex(tmp_path / "a.pex", wheels))
    assert (art.version, art.machines, art.pythons) == ("0.3.1", {"aarch64"}, {"3.11", "3.12"})
    art.check_runs_on("aarch64", "3.12")
    with pytest.raises(ArtifactError, match="host is x86_64: use the linux-amd64 artifact"):
        art.check_runs_on("x86_64", "3.11")
    with pytest.raises(ArtifactError, match=r"host's python3 is 3.13: rebuild with hack/release.sh -p 3.13"):
        art.check_runs_on("aarch64", "3.13")
    with pytest.raises(ArtifactError, match="not of llmgw"):
        inspect(_fake_pex(tmp_path / "b.pex", wheels, entry_point="black:main"))
    assert inspect(_fake_pex(tmp_path / "old.pex", wheels, entry_point="llmgw.cli.main:cli")).version == "0.3.1"
    with pytest.raises(ArtifactError, match="does not contain the llmgw wheel"):
        inspect(_fake_pex(tmp_path / "c.pex", wheels[1:]))

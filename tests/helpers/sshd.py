"""A real OpenSSH server (Debian's openssh-server) on a free loopback port, for onboarding tests.

    sshd = start_sshd(tmp_dir)        # pytest.skip (with the reason) when it cannot run here
    sshd.port, sshd.identity, sshd.known_hosts, sshd.stop()

It runs as the current user with its own host key, config and authorized_keys,
and accepts only the client key it generated.
"""
from __future__ import annotations

import os
import shutil
import socket
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

from llmgw.dev.process import terminate
from tests.helpers.poll import until_sync

SSHD = "/usr/sbin/sshd"
INSTALL_HINT = "install Debian's openssh-server and openssh-client (apt-get install openssh-server openssh-client)"


@dataclass
class Sshd:
    port: int
    identity: str
    known_hosts: str
    proc: subprocess.Popen
    log: Path

    def stop(self) -> None:
        terminate(self.proc)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_sshd(workdir: Path) -> Sshd:
    if not os.path.exists(SSHD):
        pytest.skip(f"no {SSHD}: {INSTALL_HINT}")
    if not shutil.which("ssh") or not shutil.which("ssh-keygen"):
        pytest.skip(f"no ssh client: {INSTALL_HINT}")
    if os.geteuid() != 0:
        pytest.skip("the sshd test logs in as root to install system files: run the tests as root")
    workdir.mkdir(parents=True, exist_ok=True)
    os.chmod(workdir, 0o700)
    host_key, client_key = workdir / "host_ed25519", workdir / "client_ed25519"
    for key in (host_key, client_key):
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
    auth = workdir / "authorized_keys"
    auth.write_text(Path(f"{client_key}.pub").read_text())
    os.chmod(auth, 0o600)
    Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)     # privilege separation directory
    port = _free_port()
    config = workdir / "sshd_config"
    config.write_text(f"""Port {port}
ListenAddress 127.0.0.1
HostKey {host_key}
PidFile {workdir / 'sshd.pid'}
AuthorizedKeysFile {auth}
PermitRootLogin prohibit-password
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
StrictModes no
Subsystem sftp internal-sftp
""")
    known = workdir / "known_hosts"
    known.write_text(f"[127.0.0.1]:{port} {Path(f'{host_key}.pub').read_text().split(' ')[0]} "
                     f"{Path(f'{host_key}.pub').read_text().split(' ')[1]}\n")
    log = workdir / "sshd.log"
    check = subprocess.run([SSHD, "-t", "-f", str(config)], capture_output=True, text=True)
    if check.returncode != 0:
        pytest.skip(f"sshd refuses its test configuration: {check.stderr.strip()}")
    proc = subprocess.Popen([SSHD, "-D", "-e", "-f", str(config)], stdout=open(log, "ab"),
                            stderr=subprocess.STDOUT, start_new_session=True)
    def accepting() -> bool:
        if proc.poll() is not None:
            raise RuntimeError(f"sshd exited with {proc.returncode}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                return True
        except OSError:
            return False
    try:
        until_sync(accepting, f"sshd to accept connections on port {port}", timeout=15, interval=0.1)
    except (AssertionError, RuntimeError) as err:
        proc.kill()
        pytest.skip(f"sshd did not start ({err}): {log.read_text()[-1000:]}")
    return Sshd(port, str(client_key), str(known), proc, log)

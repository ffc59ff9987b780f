"""Run shell scripts on a remote host with the system's OpenSSH client.

Every call is one `ssh` process in batch mode (no password prompts): a
script runs under `sh -c`, as root or, for another login user, under
`sudo -n`. Data travels on the script's standard input. A host key is
trusted on first use (StrictHostKeyChecking=accept-new) and checked after.
"""
from __future__ import annotations

import shlex
import socket
import subprocess
import time
from dataclasses import dataclass, field


class SshError(Exception):
    pass


@dataclass
class Ssh:
    host: str
    user: str = "root"
    port: int = 22
    identity: str | None = None
    known_hosts: str | None = None          # default: the user's ~/.ssh/known_hosts
    options: list[str] = field(default_factory=list)   # extra `-o KEY=VALUE`
    connect_timeout: int = 10

    @property
    def target(self) -> str:
        return f"{self.user}@{self.host}"

    def argv(self, remote_command: str) -> list[str]:
        argv = ["ssh", "-p", str(self.port), "-o", "BatchMode=yes", "-o", f"ConnectTimeout={self.connect_timeout}",
                "-o", "StrictHostKeyChecking=accept-new", "-o", "LogLevel=ERROR"]
        if self.identity:
            argv += ["-i", self.identity, "-o", "IdentitiesOnly=yes"]
        if self.known_hosts:
            argv += ["-o", f"UserKnownHostsFile={self.known_hosts}"]
        for opt in self.options:
            argv += ["-o", opt]
        return argv + [self.target, remote_command]

    def remote_command(self, script: str) -> str:
        cmd = ["sh", "-c", script]
        if self.user != "root":
            cmd = ["sudo", "-n", "--", *cmd]
        return shlex.join(cmd)

    def run(self, script: str, input: bytes | None = None, check: bool = True,
            timeout: float = 300) -> subprocess.CompletedProcess[str]:
        """Run `script` remotely; stdout/stderr as text. check: SshError on non-zero exit."""
        argv = self.argv(self.remote_command(script))
        try:
            proc = subprocess.run(argv, input=input if input is not None else b"", capture_output=True,
                                  timeout=timeout)
        except subprocess.TimeoutExpired:
            raise SshError(f"ssh {self.target}: no answer within {timeout:.0f}s") from None
        out = subprocess.CompletedProcess(argv, proc.returncode, proc.stdout.decode(errors="replace"),
                                          proc.stderr.decode(errors="replace"))
        if proc.returncode == 255:
            raise SshError(f"ssh {self.target} (port {self.port}) failed: {out.stderr.strip() or 'no message'}; "
                           "check the address, that sshd runs there, and that this host's key is authorized")
        if check and proc.returncode != 0:
            if self.user != "root" and "sudo" in out.stderr and "password" in out.stderr:
                raise SshError(f"{self.target}: sudo needs a password; give {self.user} passwordless sudo "
                               "or use --ssh-user root")
            raise SshError(f"on {self.host}: `{script.strip().splitlines()[0][:120]}` failed "
                           f"(exit {proc.returncode}): {out.stderr.strip() or out.stdout.strip()}")
        return out

    def wait_reachable(self, timeout: float) -> None:
        """Wait until the host's ssh port accepts connections and a login works."""
        deadline = time.monotonic() + timeout
        last = "no connection"
        while time.monotonic() < deadline:
            try:
                with socket.create_connection((self.host, self.port), timeout=3):
                    pass
                self.run("true", timeout=30)
                return
            except (OSError, SshError) as err:
                last = str(err)
            time.sleep(2)
        raise SshError(f"{self.target} port {self.port} not reachable within {timeout:.0f}s: {last}")

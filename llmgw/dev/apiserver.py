"""The API server alone, a process on an etcd of the caller's: for the tests of the server and of its
clients, and the API's benchmarks (a whole cluster is cluster.py's).

    server = start_api_server(ca_dir, etcd.endpoint, workdir, *more_server_flags)
    server.url, server.ca, server.admin (cert, key)   # the CA in ca_dir made if absent
    server.send(server.admin, "GET", "/models")         # a raw request: (status, JSON answer)
    server.restart(); server.stop()

It listens on a port of its choosing (`--listen 127.0.0.1:0`), read back from its log.
"""
from __future__ import annotations

import json
import re
import ssl
import subprocess
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from llmgw.dev.process import LLMGW, spawn, terminate
from llmgw.pki.ca import CertificateAuthority

API = "/apis/llmgw.io/v1"
LISTENING = re.compile(r"listening on https://([\d.]+):(\d+)")


@dataclass
class ApiServer:
    url: str
    ca_dir: Path
    admin: tuple[str, str]
    log_path: Path
    etcd: str
    proc: subprocess.Popen[bytes] = field(repr=False)
    argv: list[str] = field(default_factory=list, repr=False)

    @property
    def ca(self) -> str:
        return str(CertificateAuthority(self.ca_dir).cert_path)

    def send(self, identity: tuple[str, str], method: str, path: str, body: bytes | None = None,
             content_type: str = "application/json") -> tuple[int, Any]:
        """`body` sent as it is (no client to fix it up) to API + `path`: the answer's status and JSON."""
        ctx = ssl.create_default_context(cafile=self.ca)
        ctx.load_cert_chain(*identity)
        req = urllib.request.Request(self.url + API + path, data=body, method=method,
                                     headers={"Content-Type": content_type})
        try:
            with urllib.request.urlopen(req, context=ctx, timeout=30) as resp:
                return resp.status, json.loads(resp.read())
        except urllib.error.HTTPError as err:
            return err.code, json.loads(err.read())

    def log_lines(self) -> list[str]:
        return self.log_path.read_text().splitlines()

    def restart(self) -> None:
        """Stop the server and start it again on the same port (same etcd, same certificates)."""
        self.stop()
        port = self.url.rsplit(":", 1)[1]
        argv = [a if a != "127.0.0.1:0" else f"127.0.0.1:{port}" for a in self.argv]
        self.proc = spawn(argv, self.log_path)
        _wait_listening(self.proc, self.log_path, skip=self.log_path.read_text().count("listening on"))

    def stop(self) -> None:
        terminate(self.proc)


def signer_flags(ca: CertificateAuthority) -> list[str]:
    """`llmgw server`'s flags for the CA's signer, where the CA has one (`llmgw ca init` makes it)."""
    if not ca.signer_cert_path.exists():
        return []
    return ["--signer-cert", str(ca.signer_cert_path), "--signer-key", str(ca.signer_key_path)]


def start_api_server(ca_dir: Path, etcd_endpoint: str, workdir: Path, *extra: str,
                     command: list[str] = LLMGW) -> ApiServer:
    """`llmgw server --listen 127.0.0.1:0 ...` as a subprocess, with a server and an admin certificate
    of the CA in `ca_dir`, and its signer when it has one (it renews certificates); returns once it
    listens. `command`: the `llmgw` to run."""
    ca = CertificateAuthority(ca_dir)
    if not ca.exists():
        ca.init()
    server = ca.issue("server", "llmgw-server", ["127.0.0.1", "localhost"])
    admin = ca.issue("admin", "dev-admin")
    log_path = workdir / "server.log"
    argv = [*command, "server", "--listen", "127.0.0.1:0", "--etcd", etcd_endpoint, "--cert", server.cert,
            "--key", server.key, "--client-ca", str(ca.cert_path), "--bookmark-interval", "1", *signer_flags(ca),
            *extra]
    proc = spawn(argv, log_path)
    host, port = _wait_listening(proc, log_path)
    return ApiServer(f"https://{host}:{port}", ca_dir, (admin.cert, admin.key), log_path, etcd_endpoint, proc, argv)


def _wait_listening(proc: subprocess.Popen[bytes], log_path: Path, skip: int = 0,
                    timeout: float = 60.0) -> tuple[str, str]:
    """The address of the `skip`+1-th "listening on" line of the log; an error with the log's tail
    if the server exits first or writes none within `timeout`."""
    deadline = time.monotonic() + timeout
    while True:
        exited = proc.poll() is not None  # read before the log: what it wrote before exiting counts
        found = LISTENING.findall(log_path.read_text())
        if len(found) > skip:
            host, port = found[skip]
            return host, port
        if exited or time.monotonic() >= deadline:
            if not exited:
                proc.kill()
            said = f"exited with {proc.poll()}" if exited else f"did not listen within {timeout:.0f}s"
            raise RuntimeError(f"llmgw server {said}:\n{log_path.read_text()[-3000:]}")
        time.sleep(0.05)

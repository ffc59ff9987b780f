"""Test fixtures: a CA made with `llmgw ca`, and a real `llmgw server` subprocess.

Use them from a test module:

    from tests.helpers.cluster import ca_dir, api_server, shared_api_server  # noqa: F401

    async def test_x(api_server):                 # function-scoped: the `etcd` fixture + a server
        async with api_server.client() as c:      # admin client; api_server.client(api_server.issue_node("n1"))
            ...
        assert api_server.wait_for_log("refused: certificate CN=")

`shared_api_server` is module-scoped (its own etcd) for modules whose tests can share state.
ApiServer: .url .ca .admin (cert, key) .issue_node(name) .issue_component(name) .issue_admin(name)
.issue(role, name, *extra_cli_args) .client(identity=None) .send(identity, method, path, body) .log_lines()
.wait_for_log(text) .pki
"""
from __future__ import annotations

import json
import os
import re
import ssl
import subprocess
import sys
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from click.testing import CliRunner

from llmgw.api.errors import Unauthorized
from llmgw.cli.ca import ca as ca_command
from llmgw.client import Client
from llmgw.dev.etcd import etcd_cluster
from llmgw.dev.process import terminate
from tests.helpers.poll import until, until_sync

API = "/apis/llmgw.io/v1"
LISTENING = re.compile(r"listening on https://([\d.]+):(\d+)")


def llmgw_ca(*args: str) -> str:
    """Run `llmgw ca ARGS...` (the real click command, in-process); its output, or an AssertionError."""
    result = CliRunner().invoke(ca_command, list(args), catch_exceptions=False)
    assert result.exit_code == 0, f"llmgw ca {' '.join(args)} failed: {result.output}"
    return result.output


@dataclass
class Pki:
    dir: Path

    @property
    def ca(self) -> str:
        return str(self.dir / "ca.crt")

    def issue(self, role: str, name: str, *extra: str) -> tuple[str, str]:
        llmgw_ca("issue", role, *([name] if role != "server" else ["--name", name]), "--dir", str(self.dir), *extra)
        base = self.dir / "issued" / f"{role}-{name}"
        return str(base.with_suffix(".crt")), str(base.with_suffix(".key"))


def make_pki(directory: Path) -> Pki:
    llmgw_ca("init", "--dir", str(directory))
    return Pki(directory)


@dataclass
class ApiServer:
    url: str
    pki: Pki
    admin: tuple[str, str]
    log_path: Path
    etcd: str
    proc: subprocess.Popen = field(repr=False)
    argv: list[str] = field(default_factory=list, repr=False)

    @property
    def ca(self) -> str:
        return self.pki.ca

    def issue(self, role: str, name: str, *extra: str) -> tuple[str, str]:
        return self.pki.issue(role, name, *extra)

    def issue_node(self, name: str, *extra: str) -> tuple[str, str]:
        return self.pki.issue("node", name, *extra)

    def issue_component(self, name: str) -> tuple[str, str]:
        return self.pki.issue("component", name)

    def issue_admin(self, name: str) -> tuple[str, str]:
        return self.pki.issue("admin", name)

    def client(self, identity: tuple[str, str] | None = None, **kw) -> Client:
        cert, key = identity or self.admin
        return Client(self.url, ca=self.ca, cert=cert, key=key, **kw)

    def send(self, identity: tuple[str, str], method: str, path: str, body: bytes | None = None,
             content_type: str = "application/json") -> tuple[int, dict]:
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

    def wait_for_log(self, text: str, timeout: float = 15.0) -> str:
        """The first log line containing `text`; AssertionError (with the log's tail) if none appears."""
        return until_sync(lambda: next((line for line in self.log_lines() if text in line), None),
                          f"a server log line containing {text!r}", timeout=timeout,
                          detail=lambda: "last lines:\n" + "\n".join(self.log_lines()[-15:]))

    def restart(self) -> None:
        """Stop the server and start it again on the same port (same etcd, same certificates)."""
        self.stop()
        port = self.url.rsplit(":", 1)[1]
        argv = [a if a != "127.0.0.1:0" else f"127.0.0.1:{port}" for a in self.argv]
        self.proc = _spawn(argv, self.log_path)
        _wait_listening(self.proc, self.log_path, skip=self.log_path.read_text().count("listening on"))

    def stop(self) -> None:
        terminate(self.proc)


def start_api_server(pki: Pki, etcd_endpoint: str, workdir: Path, *extra: str) -> ApiServer:
    """`llmgw server --listen 127.0.0.1:0 ...` as a subprocess; returns once it listens."""
    server_cert, server_key = pki.issue("server", "llmgw-server", "--san", "127.0.0.1", "--san", "localhost")
    admin = pki.issue("admin", "test-admin")
    log_path = workdir / "server.log"
    argv = [sys.executable, "-c", "from llmgw.cli.main import cli; cli()", "server",
            "--listen", "127.0.0.1:0", "--etcd", etcd_endpoint, "--cert", server_cert, "--key", server_key,
            "--client-ca", pki.ca, "--bookmark-interval", "1", *extra]
    proc = _spawn(argv, log_path)
    host, port = _wait_listening(proc, log_path)
    return ApiServer(f"https://{host}:{port}", pki, admin, log_path, etcd_endpoint, proc, argv)


def _spawn(argv: list[str], log_path: Path) -> subprocess.Popen:
    with open(log_path, "ab") as log:
        return subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                                env={**os.environ, "PYTHONUNBUFFERED": "1"})


def _wait_listening(proc: subprocess.Popen, log_path: Path, skip: int = 0) -> tuple[str, str]:
    def listening() -> tuple[str, str] | None:
        exited = proc.poll() is not None  # read before the log: what it wrote before exiting counts
        found = LISTENING.findall(log_path.read_text())
        if len(found) > skip:
            return found[skip]
        if exited:
            raise RuntimeError(f"llmgw server exited with {proc.poll()}:\n{log_path.read_text()[-3000:]}")
        return None
    try:
        return until_sync(listening, "llmgw server to listen", detail=lambda: log_path.read_text()[-3000:])
    except AssertionError:
        proc.kill()
        raise


async def until_revoked(client: Client, node: str) -> None:
    """Heartbeat as `node` until the server refuses it as revoked: it learns of a revocation
    through its watch of /llmgw/revoked/, a moment after `llmgw ca revoke` returns."""
    async def refused() -> Unauthorized | None:
        try:
            await client.heartbeat(node)
        except Unauthorized as err:
            return err
        return None
    err = await until(refused, "the revoked certificate to be refused")
    assert err.reason == "CertificateRevoked"


@pytest.fixture
def ca_dir(tmp_path) -> Pki:
    """A fresh CA made with `llmgw ca init`; .issue(role, name) -> (cert, key)."""
    return make_pki(tmp_path / "ca")


@pytest.fixture
def api_server(etcd, ca_dir, tmp_path):
    server = start_api_server(ca_dir, etcd.endpoint, tmp_path)
    yield server
    server.stop()


@pytest.fixture(scope="module", name="config")
def admin_cli_config(shared_api_server, tmp_path_factory) -> Path:
    """`config`: the client config written by `llmgw ca issue admin --write-config` for shared_api_server."""
    path = tmp_path_factory.mktemp("client") / "config.yaml"
    llmgw_ca("issue", "admin", "cli-user", "--dir", str(shared_api_server.pki.dir), "--write-config",
             "--server", shared_api_server.url, "--config", str(path))
    return path


def llmgw(config: Path, *args: str):
    """The real `llmgw` click command, in-process, as the admin of `config`."""
    from llmgw.cli.main import cli
    return CliRunner().invoke(cli, list(args), env={"LLMGW_CONFIG": str(config)}, catch_exceptions=False)


@pytest.fixture(scope="module")
def shared_api_server(tmp_path_factory):
    """A module-wide etcd + CA + server (tests must use distinct object names)."""
    base = tmp_path_factory.mktemp("cluster")
    etcd = etcd_cluster(base / "etcd", size=1).start()
    server = start_api_server(make_pki(base / "ca"), etcd.endpoint, base)
    yield server
    server.stop()
    etcd.stop()

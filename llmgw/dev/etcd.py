"""Start real etcd members on loopback (for `llmgw dev up` and the tests).

With an llmgw CA (`etcd_cluster(..., ca=...)`) the members run as production ones should
(README, "Production security"): TLS to clients and peers, a client certificate from the
etcd CA required of both (--client-cert-auth, --peer-client-cert-auth). Without one, plain
http, which the tests' store fixtures use for speed.
"""
from __future__ import annotations

import shutil
import ssl
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from llmgw.dev.process import free_port, spawn, terminate, wait_http
from llmgw.pki import CertificateAuthority


def etcd_binary() -> str:
    path = shutil.which("etcd") or ("/usr/bin/etcd" if Path("/usr/bin/etcd").exists() else None)
    if not path:
        raise FileNotFoundError("executable file not found: etcd (install Debian's etcd-server package)")
    return path


@dataclass
class EtcdTLS:
    """The etcd CA's certificate, each member's certificate, and one client's (for health checks)."""
    ca: str
    members: dict[str, tuple[str, str]]
    client: tuple[str, str]

    def client_context(self) -> ssl.SSLContext:
        ctx = ssl.create_default_context(cafile=self.ca)
        ctx.load_cert_chain(*self.client)
        return ctx


@dataclass
class Member:
    name: str
    data_dir: Path
    client_port: int
    peer_port: int
    log_path: Path
    host: str = "127.0.0.1"
    scheme: str = "http"
    proc: subprocess.Popen[bytes] | None = None
    metrics_port: int = 0   # plain-HTTP /metrics (--listen-metrics-urls): Prometheus needs no client certificate

    @property
    def metrics_address(self) -> str:
        return f"{self.host}:{self.metrics_port}"

    @property
    def endpoint(self) -> str:
        return f"{self.scheme}://{self.host}:{self.client_port}"

    @property
    def peer_url(self) -> str:
        return f"{self.scheme}://{self.host}:{self.peer_port}"


@dataclass
class EtcdCluster:
    members: list[Member] = field(default_factory=list)
    tls: EtcdTLS | None = None
    extra_args: list[str] = field(default_factory=list)   # more flags for every member

    @property
    def endpoint(self) -> str:
        return self.members[0].endpoint

    @property
    def endpoints(self) -> list[str]:
        return [m.endpoint for m in self.members]

    def start(self, timeout: float = 30.0, tries: int = 3) -> "EtcdCluster":
        """Start a new cluster. A free port can be taken by another process before etcd binds
        it: then the members start again, new and on other ports."""
        attempt = 1
        while True:
            for m in self.members:
                self._spawn(m)
            try:
                for m in self.members:
                    self._wait_ready(m, timeout)
                return self
            except RuntimeError:
                if attempt == tries or not self._lost_a_port():
                    raise
            attempt += 1
            self.stop()
            for m in self.members:
                shutil.rmtree(m.data_dir, ignore_errors=True)
                m.client_port, m.peer_port = free_port(m.host), free_port(m.host)
                m.metrics_port = free_port(m.host)

    def _lost_a_port(self) -> bool:
        return any(m.proc is not None and m.proc.poll() is not None
                   and b"address already in use" in m.log_path.read_bytes() for m in self.members)

    def _tls_flags(self, m: Member) -> list[str]:
        if self.tls is None:
            return []
        cert, key = self.tls.members[m.name]
        return ["--cert-file", cert, "--key-file", key, "--client-cert-auth", "--trusted-ca-file", self.tls.ca,
                "--peer-cert-file", cert, "--peer-key-file", key, "--peer-client-cert-auth",
                "--peer-trusted-ca-file", self.tls.ca]

    def restart(self, m: Member, timeout: float = 30.0) -> None:
        """Start a member that was stopped again, on its ports and data dir: it rejoins as itself."""
        self._spawn(m)
        self._wait_ready(m, timeout)

    def _spawn(self, m: Member) -> None:
        cluster = ",".join(f"{x.name}={x.peer_url}" for x in self.members)
        m.data_dir.mkdir(parents=True, exist_ok=True)
        argv = [
            etcd_binary(), "--name", m.name, "--data-dir", str(m.data_dir),
            "--listen-client-urls", m.endpoint, "--advertise-client-urls", m.endpoint,
            "--listen-peer-urls", m.peer_url, "--initial-advertise-peer-urls", m.peer_url,
            "--initial-cluster", cluster, "--initial-cluster-state", "new",
            "--initial-cluster-token", f"llmgw-{m.data_dir.parent.name}",
            # loopback tests: short timeouts; no auto-compaction (llmgw compacts itself)
            "--heartbeat-interval", "50", "--election-timeout", "500",
            "--max-request-bytes", str(16 * 1024 * 1024),
            "--listen-metrics-urls", f"http://{m.metrics_address}",
            *self._tls_flags(m), *self.extra_args,
        ]
        m.proc = spawn(argv, m.log_path)

    def _wait_ready(self, m: Member, timeout: float) -> None:
        proc = m.proc
        assert proc is not None  # started

        def alive() -> None:
            if proc.poll() is not None:
                raise RuntimeError(f"etcd {m.name} exited with {proc.returncode}; see {m.log_path}")
        wait_http(f"{m.endpoint}/health", alive, f"etcd {m.name} (log: {m.log_path})", timeout,
                  ready=lambda body: b'"true"' in body, context=self.tls.client_context() if self.tls else None)

    def stop_member(self, m: Member) -> None:
        if m.proc:
            terminate(m.proc)

    def stop(self) -> None:
        for m in self.members:
            self.stop_member(m)


def etcd_cluster(base: Path, size: int = 1, ca: CertificateAuthority | None = None,
                 host: str = "127.0.0.1", extra_args: Sequence[str] = ()) -> EtcdCluster:
    """Members on free ports of `host`; with `ca`, over TLS with certificates from its etcd CA;
    `extra_args`: more flags for each member (e.g. a small --quota-backend-bytes)."""
    base = Path(base)
    members = [
        Member(f"m{i}", base / f"m{i}", free_port(host), free_port(host), base / f"m{i}.log", host,
               "https" if ca else "http", metrics_port=free_port(host))
        for i in range(size)
    ]
    base.mkdir(parents=True, exist_ok=True)
    tls = None
    if ca is not None:
        etcd_ca = ca.etcd()
        issued = {m.name: etcd_ca.issue("etcd-member", m.name, sans=[host, "localhost"]) for m in members}
        health = etcd_ca.issue("etcd-client", "etcd-health")
        tls = EtcdTLS(str(etcd_ca.cert_path), {n: (e.cert, e.key) for n, e in issued.items()},
                      (health.cert, health.key))
    return EtcdCluster(members, tls, list(extra_args))

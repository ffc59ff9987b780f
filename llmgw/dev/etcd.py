"""Start real etcd members on loopback (for `llmgw dev up` and the tests)."""
from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from llmgw.dev.process import free_port, terminate, wait_http


def etcd_binary() -> str:
    path = shutil.which("etcd") or ("/usr/bin/etcd" if Path("/usr/bin/etcd").exists() else None)
    if not path:
        raise FileNotFoundError("executable file not found: etcd (install Debian's etcd-server package)")
    return path


@dataclass
class Member:
    name: str
    data_dir: Path
    client_port: int
    peer_port: int
    log_path: Path
    proc: subprocess.Popen | None = None

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.client_port}"

    @property
    def peer_url(self) -> str:
        return f"http://127.0.0.1:{self.peer_port}"


@dataclass
class EtcdCluster:
    members: list[Member] = field(default_factory=list)

    @property
    def endpoint(self) -> str:
        return self.members[0].endpoint

    @property
    def endpoints(self) -> list[str]:
        return [m.endpoint for m in self.members]

    def start(self, timeout: float = 30.0) -> "EtcdCluster":
        cluster = ",".join(f"{m.name}={m.peer_url}" for m in self.members)
        for m in self.members:
            self._spawn(m, cluster)
        for m in self.members:
            self._wait_ready(m, timeout)
        return self

    def _spawn(self, m: Member, cluster: str) -> None:
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
        ]
        log = open(m.log_path, "ab")
        m.proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        log.close()

    @staticmethod
    def _wait_ready(m: Member, timeout: float) -> None:
        def alive() -> None:
            if m.proc.poll() is not None:
                raise RuntimeError(f"etcd {m.name} exited with {m.proc.returncode}; see {m.log_path}")
        wait_http(f"{m.endpoint}/health", alive, f"etcd {m.name} (log: {m.log_path})", timeout,
                  ready=lambda body: b'"true"' in body)

    def stop_member(self, m: Member) -> None:
        if m.proc:
            terminate(m.proc)

    def stop(self) -> None:
        for m in self.members:
            self.stop_member(m)


def etcd_cluster(base: Path, size: int = 1) -> EtcdCluster:
    base = Path(base)
    members = [
        Member(f"m{i}", base / f"m{i}", free_port(), free_port(), base / f"m{i}.log")
        for i in range(size)
    ]
    base.mkdir(parents=True, exist_ok=True)
    return EtcdCluster(members)

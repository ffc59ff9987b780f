"""A whole llmgw cluster on loopback, every component a separate process.

Used by `llmgw dev up` and by the end-to-end test. Layout under the cluster
directory:

    ca/                       the certificate authority (ca.crt, issued/...; etcd/: the etcd CA)
    admin/config.yaml         client configuration for `llmgw` (LLMGW_CONFIG)
    etcd/                     etcd's data, log, `endpoint` and `etcdctl.env`
    logs/<component>.log      server (server-2, ... with several), controller-manager, gateway, agent-<node>
    nodes/<node>/             fake nvidia-smi, fake sysfs, the agent's state dir
    cluster.json              addresses (servers: every API server's URL; metrics: each component's /metrics)
                              and pids, read by `llmgw dev down`
    prometheus.yml            a scrape config for every component (llmgw.dev.prometheus)
    netns.json                `dev up --netns`: the nodes' namespaces and bridge (llmgw.dev.netns)

Each node gets its own loopback address, so engines bind where a real node's
engines would: on the node's address. The addresses (127.0.K.N) and the engines'
port range come from the cluster's slot (llmgw.dev.slots): two clusters on one
machine never share them (with `--netns`, each node is in a network namespace of its own at
an address of a private /24 instead, and the server listens on the bridge's). etcd runs as
in production: TLS with client certificates from the etcd CA, held by the server, the controller-manager and
the admin (for etcdctl) only.
"""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from llmgw.dev import prometheus, slots
from llmgw.dev.apiserver import signer_flags
from llmgw.dev.etcd import EtcdCluster, etcd_cluster
from llmgw.dev.netns import Network, remove_saved
from llmgw.dev.process import LLMGW, free_port, spawn, wait_http
from llmgw.pki.ca import CertificateAuthority

REPO = Path(__file__).resolve().parents[2]
FAKES = REPO / "hack" / "fakes"
MARKER = "LLMGW_DEV_CLUSTER"  # set in every process we start; `down` finds leftovers by it
NODE_MARKER = "LLMGW_DEV_NODE"


@dataclass
class NodePlan:
    name: str
    fabric: str | None = None   # None: an island
    address: str | None = None  # None: the cluster's slot gives one


NETNS_FILE = "netns.json"   # the namespaces of `dev up --netns`, for `dev down`


class PortTaken(RuntimeError):
    """A port the cluster must listen on is in use."""

    def __init__(self, port: int, what: str):
        self.port = port
        super().__init__(f"port {port} for the {what} is taken on 127.0.0.1")


def default_nodes(count: int) -> list[NodePlan]:
    """Two nodes on ib-a, one on ib-b, one island; more nodes continue the pattern."""
    pattern = ["ib-a", "ib-a", "ib-b", None]
    return [NodePlan(f"node{i + 1:02d}", pattern[i % len(pattern)]) for i in range(count)]


@dataclass
class LocalCluster:
    dir: Path
    nodes: list[NodePlan]
    gateway_port: int = 8000
    server_port: int = 0             # the first server's; the others' are free ports (server_ports)
    servers: int = 1                 # how many API servers, over the one etcd; every client is given them all
    server_host: str = "127.0.0.1"   # where the server listens (a test's nodes in network namespaces reach a bridge's)
    node_grace: float = 30.0
    heartbeat_ttl: int | None = None  # the servers' --heartbeat-ttl (None: their default, 15 s)
    drain_delay: float = 2.0
    gpus_per_node: int = 8
    lease_seconds: float = 15.0
    engines: dict[str, str] = field(default_factory=dict)  # agent --engine NAME=PATH, on every node
    gateway_args: list[str] = field(default_factory=list)  # more flags of `llmgw gateway`
    etcd_members: int = 1
    etcd: EtcdCluster | None = None
    slot: slots.Slot | None = None
    procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    metrics_ports: dict[str, int] = field(default_factory=dict)  # component -> its /metrics port
    metrics_hosts: dict[str, str] = field(default_factory=dict)  # component -> its address, where not loopback
    # component -> a command its own runs under, e.g. {"agent-node01": ["faketime", "-f", "+5m"]}
    wrap: dict[str, list[str]] = field(default_factory=dict)
    renewals: bool = True     # the servers sign renewals with the CA's signer (a release before 0.3 cannot)

    def __post_init__(self) -> None:
        self.dir = Path(self.dir).resolve()
        self.server_port = self.server_port or free_port()
        self.server_ports = [self.server_port, *(free_port() for _ in range(self.servers - 1))]

    # --------------------------------------------------------------- paths

    @property
    def server_url(self) -> str:
        """The first server's URL."""
        return self.server_urls[0]

    @property
    def server_urls(self) -> list[str]:
        return [f"https://{self.server_host}:{port}" for port in self.server_ports]

    @staticmethod
    def server_name(index: int) -> str:
        """The component name of the server at `index`: server, server-2, server-3, ..."""
        return "server" if index == 0 else f"server-{index + 1}"

    @property
    def gateway_url(self) -> str:
        return f"http://127.0.0.1:{self.gateway_port}"

    @property
    def admin_config(self) -> Path:
        return self.dir / "admin" / "config.yaml"

    def log(self, component: str) -> Path:
        return self.dir / "logs" / f"{component}.log"

    def metrics_listen(self, component: str, host: str = "127.0.0.1") -> str:
        """The component's metrics address, the same each time it starts (`host`: a node in a
        network namespace of its own listens on its address, where the host reaches it)."""
        if host != "127.0.0.1":
            self.metrics_hosts[component] = host
        return f"{host}:{self.metrics_ports.setdefault(component, free_port())}"

    @property
    def metrics_addresses(self) -> dict[str, str]:
        """component -> where its /metrics is (the gateway's is on its own port; etcd's on a plain-HTTP one)."""
        out = {name: f"{self.metrics_hosts.get(name, '127.0.0.1')}:{port}" for name, port in self.metrics_ports.items()}
        if "gateway" in self.procs:
            out["gateway"] = f"127.0.0.1:{self.gateway_port}"
        for m in self.etcd.members if self.etcd else ():
            out[f"etcd-{m.name}"] = m.metrics_address
        return out

    def env(self) -> dict[str, str]:
        return {**os.environ, MARKER: str(self.dir), "LLMGW_CONFIG": str(self.admin_config),
                "PYTHONUNBUFFERED": "1"}

    # --------------------------------------------------------------- setup

    def _pki(self) -> None:
        ca = CertificateAuthority(self.dir / "ca")
        if not ca.exists():
            ca.init()
        self.certs = {}
        for role, name, sans in [("server", "llmgw-server", sorted({"127.0.0.1", "localhost", self.server_host})),
                                 ("admin", "dev-admin", []),
                                 ("component", "controller-manager", []),
                                 ("component", "gateway", [])]:
            issued = ca.issue(role, name, sans=sans)
            self.certs[name] = (issued.cert, issued.key)
        for n in self.nodes:
            issued = ca.issue("node", n.name)
            self.certs[n.name] = (issued.cert, issued.key)
        self.ca_cert = str(ca.cert_path)
        etcd_ca = ca.etcd()
        self.etcd_ca = str(etcd_ca.cert_path)
        self.etcd_certs = {}
        for name in ("llmgw-server", "controller-manager", "dev-admin"):  # never a node or the gateway
            issued = etcd_ca.issue("etcd-client", name)
            self.etcd_certs[name] = (issued.cert, issued.key)
        self.admin_config.parent.mkdir(parents=True, exist_ok=True)
        cert, key = self.certs["dev-admin"]
        servers = self.server_url if self.servers == 1 else f"[{', '.join(self.server_urls)}]"
        self.admin_config.write_text(f"server: {servers}\nca: {self.ca_cert}\ncert: {cert}\nkey: {key}\n")

    def _fake_hardware(self, n: NodePlan) -> tuple[Path, Path]:
        ndir = self.dir / "nodes" / n.name
        ndir.mkdir(parents=True, exist_ok=True)
        smi = ndir / "nvidia-smi"
        smi.write_text(f"#!/bin/sh\nexec {FAKES / 'nvidia-smi'} --fake-gpus={self.gpus_per_node} \"$@\"\n")
        smi.chmod(0o755)
        sysfs = ndir / "sysfs"
        if n.fabric:
            subprocess.run([sys.executable, str(FAKES / "make_sysfs.py"), str(sysfs), "mlx5_0", "mlx5_1"],
                           check=True, stdout=subprocess.DEVNULL)
        else:
            sysfs.mkdir(exist_ok=True)  # an island: no InfiniBand adapters
        return smi, sysfs

    def _spawn(self, component: str, argv: list[str], env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
        proc = spawn([*self.wrap.get(component, []), *argv], self.log(component), {**self.env(), **(env or {})},
                     cwd=self.dir)
        self.procs[component] = proc
        self._save()
        return proc

    def _save(self) -> None:
        state = {
            "owner_pid": os.getpid(),   # `llmgw dev up` (or a test): `down` asks it to stop first
            "server": self.server_url, "servers": self.server_urls, "gateway": self.gateway_url,
            "etcd": self.etcd.endpoints if self.etcd else [],
            "pids": {name: p.pid for name, p in self.procs.items()},
            "etcd_pids": [m.proc.pid for m in self.etcd.members if m.proc] if self.etcd else [],
            "slot": self.slot.index if self.slot else None,
            "metrics": self.metrics_addresses,
        }
        (self.dir / "cluster.json").write_text(json.dumps(state, indent=1))
        (self.dir / "prometheus.yml").write_text(prometheus.scrape_config(self.metrics_addresses))

    # --------------------------------------------------------------- components

    def etcd_flags(self, name: str) -> list[str]:
        """--etcd and its TLS flags, with the etcd client certificate issued to `name`."""
        cert, key = self.etcd_certs[name]
        assert self.etcd is not None  # start made it
        return ["--etcd", ",".join(self.etcd.endpoints), "--etcd-ca", self.etcd_ca, "--etcd-cert", cert,
                "--etcd-key", key]

    def start_server(self, index: int = 0) -> None:
        cert, key = self.certs["llmgw-server"]
        name = self.server_name(index)
        self._spawn(name, [*LLMGW, "server", "--listen", f"{self.server_host}:{self.server_ports[index]}",
                           *self.etcd_flags("llmgw-server"), "--cert", cert, "--key", key,
                           "--client-ca", self.ca_cert, "--metrics-listen", self.metrics_listen(name),
                           *(["--heartbeat-ttl", str(self.heartbeat_ttl)] if self.heartbeat_ttl else []),
                           *(signer_flags(CertificateAuthority(self.dir / "ca")) if self.renewals else [])])

    def start_controller_managers(self) -> None:
        self.start_controller_manager()

    def start_controller_manager(self, name: str = "controller-manager") -> None:
        self._spawn(name, [*LLMGW, "controller-manager", *self.etcd_flags("controller-manager"),
                           "--metrics-listen", self.metrics_listen(name),
                           "--node-grace", str(self.node_grace), "--lease-seconds", str(self.lease_seconds)])

    def start_gateway(self, name: str = "gateway", port: int | None = None) -> None:
        """The gateway, or another one (`name`, on `port`) beside it, as behind a load balancer."""
        cert, key = self.certs["gateway"]
        self._spawn(name, [*LLMGW, "gateway", "--listen", f"127.0.0.1:{port or self.gateway_port}",
                           "--server", ",".join(self.server_urls), "--ca", self.ca_cert, "--cert", cert,
                           "--key", key, *self.gateway_args])

    def start_agent(self, n: NodePlan) -> None:
        smi, sysfs = self._fake_hardware(n)
        cert, key = self.certs[n.name]
        assert self.slot is not None  # start took it
        argv = [*LLMGW, "agent", "--node", n.name, "--server", ",".join(self.server_urls),
                "--ca", self.ca_cert, "--cert", cert, "--key", key,
                "--nvidia-smi", str(smi), "--ib-root", str(sysfs),
                "--state-dir", str(self.dir / "nodes" / n.name / "state"),
                "--advertise-address", self.address(n), "--port-range", self.slot.port_range,
                "--drain-delay", f"{self.drain_delay}s",
                "--stop-grace-period", "10s", "--heartbeat-interval", "2s",
                "--logs-listen", f"{self.address(n)}:0",
                "--metrics-listen", self.metrics_listen(f"agent-{n.name}", n.address or "127.0.0.1")]
        if n.fabric:
            argv += ["--fabric", n.fabric]
        for name, path in self.engines.items():
            argv += ["--engine", f"{name}={path}"]
        # engines inherit the agent's environment: NODE_MARKER finds a node's processes
        self._spawn(f"agent-{n.name}", argv, env={NODE_MARKER: n.name})

    def use_network(self, net: Network) -> None:
        """Each node in its namespace of `net` (its agent, and so its engines, run inside, at the
        namespace's address); the server listens on the bridge's address, where the nodes reach it."""
        for p in self.nodes:
            p.address = net.address(p.name)
        self.server_host = net.host
        self.wrap.update({f"agent-{p.name}": net.exec_prefix(p.name) for p in self.nodes})

    def address(self, n: NodePlan) -> str:
        """The node's own address, or the one the slot gives its place in the cluster."""
        assert self.slot is not None  # start took it
        return n.address or self.slot.address(next(i for i, p in enumerate(self.nodes) if p.name == n.name))

    def node_pids(self, node: str) -> list[int]:
        """The agent and engine processes of one node."""
        return marked_pids(self.dir, f"{NODE_MARKER}={node}")

    def start(self) -> "LocalCluster":
        _check_free(self.gateway_port, "gateway")
        self.dir.mkdir(parents=True, exist_ok=True)
        (self.dir / "logs").mkdir(exist_ok=True)
        self.slot = slots.acquire(prefer=_last_slot(self.dir))
        self._pki()
        self.etcd = etcd_cluster(self.dir / "etcd", self.etcd_members, ca=CertificateAuthority(self.dir / "ca")).start()
        self._write_etcd_access()
        for i in range(self.servers):
            self.start_server(i)
        for i in range(self.servers):
            self.wait_server(index=i)
        self.start_controller_managers()
        self.start_gateway()
        for n in self.nodes:
            self.start_agent(n)
        self.wait_http(f"{self.gateway_url}/healthz", "gateway")
        return self

    # --------------------------------------------------------------- waiting

    def _write_etcd_access(self) -> None:
        """etcd/endpoint, and etcd/etcdctl.env: `. etcdctl.env; etcdctl get --prefix /llmgw/` as the admin."""
        assert self.etcd is not None  # start made it
        (self.dir / "etcd" / "endpoint").write_text(self.etcd.endpoint + "\n")
        cert, key = self.etcd_certs["dev-admin"]
        (self.dir / "etcd" / "etcdctl.env").write_text(
            f"export ETCDCTL_API=3 ETCDCTL_ENDPOINTS={self.etcd.endpoint} ETCDCTL_CACERT={self.etcd_ca} "
            f"ETCDCTL_CERT={cert} ETCDCTL_KEY={key}\n")

    def check_alive(self) -> None:
        for name, p in self.procs.items():
            if p.poll() is not None and not name.startswith("stopped:"):
                tail = self.log(name).read_text(errors="replace").splitlines()[-15:]
                raise RuntimeError(f"{name} exited with {p.returncode}; last lines of {self.log(name)}:\n"
                                   + "\n".join(tail))

    def wait_http(self, url: str, component: str, timeout: float = 60.0) -> None:
        wait_http(url, self.check_alive, f"{component} (log: {self.log(component)})", timeout)

    def wait_server(self, timeout: float = 60.0, index: int = 0) -> None:
        port = self.server_ports[index]
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self.check_alive()
            try:
                socket.create_connection((self.server_host, port), timeout=1).close()
                return
            except OSError:
                time.sleep(0.1)
        raise TimeoutError(f"{self.server_name(index)} did not listen on {port} within {timeout:.0f}s; "
                           f"see {self.log(self.server_name(index))}")

    # --------------------------------------------------------------- stopping

    def stop_process(self, name: str, sig: int = signal.SIGTERM, timeout: float = 15.0) -> None:
        self.stop_processes([name], sig, timeout)

    def stop_processes(self, names: list[str], sig: int = signal.SIGTERM, timeout: float = 15.0) -> None:
        """Signal each of `names` at once, then wait for them all (up to `timeout`: then SIGKILL), so
        their shutdowns overlap (a cluster's took a second and a half one after another)."""
        signalled = []
        for p in (self.procs.get(name) for name in names):
            if p is None or p.poll() is not None:
                continue
            try:
                os.killpg(p.pid, sig)
            except ProcessLookupError:
                continue
            signalled.append(p)
        deadline = time.monotonic() + timeout
        for p in signalled:
            try:
                p.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()

    def stop(self) -> None:
        """The agents, then the gateways (each withdraws its demand report through a server still
        up, so a `dev up` right after this one finds none of them live), then the rest, then etcd."""
        for group in ("agent-", "gateway"):
            self.stop_processes([name for name in self.procs if name.startswith(group)])
        self.stop_processes(list(self.procs))
        kill_marked(self.dir)
        if self.etcd:
            self.etcd.stop()
        if self.slot:
            self.slot.release()


def _check_free(port: int, what: str) -> None:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the listener will: only a listener counts
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            raise PortTaken(port, what) from None


def _last_slot(cluster_dir: Path) -> int | None:
    try:
        slot: int | None = json.loads((cluster_dir / "cluster.json").read_text()).get("slot")
        return slot
    except (OSError, ValueError):
        return None


def marked_pids(cluster_dir: Path, also: str | None = None) -> list[int]:
    """Processes whose environment carries this cluster's marker (engines included)."""
    want = {f"{MARKER}={cluster_dir}".encode()} | ({also.encode()} if also else set())
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            if want <= set((entry / "environ").read_bytes().split(b"\0")):
                found.append(int(entry.name))
        except OSError:
            continue
    return found


def kill_marked(cluster_dir: Path, grace: float = 10.0) -> None:
    pids = marked_pids(cluster_dir)
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in pids:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + grace
        while pids and time.monotonic() < deadline:
            pids = [p for p in pids if Path(f"/proc/{p}").exists() and not _zombie(p)]
            time.sleep(0.1)
        if not pids:
            return


def _zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ", 1)[1].startswith("Z")
    except (OSError, IndexError):
        return True


def _is_dev_up(pid: int) -> bool:
    """Whether pid is still a `llmgw dev up` (not a process that got its number since)."""
    try:
        args = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    return any(a == b"dev" and b == b"up" for a, b in zip(args, args[1:], strict=False)) and not _zombie(pid)


def _stop_owner(pid: int, timeout: float = 60.0) -> None:
    """SIGTERM a running `dev up`: it stops its cluster and says so, rather than
    reporting each component's death as a failure."""
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + timeout
    while _is_dev_up(pid) and time.monotonic() < deadline:
        time.sleep(0.2)


def down(cluster_dir: Path) -> int:
    """Stop everything a cluster directory's `up` started; returns how many processes were signalled."""
    cluster_dir = Path(cluster_dir).resolve()
    state_file = cluster_dir / "cluster.json"
    pids = []
    if state_file.exists():
        state = json.loads(state_file.read_text())
        owner = state.get("owner_pid")
        if owner and owner != os.getpid() and _is_dev_up(owner):
            _stop_owner(owner)
            pids.append(owner)
        pids += [*state.get("pids", {}).values(), *state.get("etcd_pids", [])]
    pids += marked_pids(cluster_dir)
    for pid in set(pids):
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
    kill_marked(cluster_dir)
    for pid in set(pids):
        if Path(f"/proc/{pid}").exists() and not _zombie(pid):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    remove_saved(cluster_dir / NETNS_FILE)   # a `dev up --netns` that could not remove its namespaces
    return len(set(pids))

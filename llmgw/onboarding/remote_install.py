"""Install llmgw's agent on a host over ssh, idempotently.

Every file is compared by SHA-256 and mode before it is sent: a second run
with the same inputs writes nothing, runs no trust update and leaves the
running agent alone. Everything lives under a root (default `/`), so a test
can install into a throwaway directory on a real ssh host.

Remote layout (relative to the root):

    usr/local/bin/llmgw                      the release artifact (0755)
    etc/llmgw/agent.yaml                     agent configuration (0644)
    etc/llmgw/pki/{ca.crt,node.crt,node.key} identity; the key 0600
    etc/systemd/system/llmgw-agent.service   the unit (written in every mode)
    usr/local/share/ca-certificates/llmgw-ca.crt   (Debian) or
    etc/pki/ca-trust/source/anchors/llmgw-ca.crt   (RHEL): the CA root, trusted system-wide
    var/lib/llmgw/{agent,pex}                state directory, the artifact's unpack cache
    var/log/llmgw-agent.log, run/llmgw-agent.pid   (service manager `direct` only)
"""
from __future__ import annotations

import base64
import hashlib
import posixpath
import shlex
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from llmgw.onboarding.ssh import Ssh, SshError

UNIT_NAME = "llmgw-agent.service"
UNITS = Path(__file__).parent / "units"   # deploy/systemd/: every component's unit
TRUST_ANCHOR = {"debian": "usr/local/share/ca-certificates/llmgw-ca.crt",
                "rhel": "etc/pki/ca-trust/source/anchors/llmgw-ca.crt"}


class InstallError(Exception):
    pass


@dataclass(frozen=True)
class Layout:
    root: str = "/"

    def path(self, rel: str) -> str:
        return posixpath.normpath(posixpath.join(self.root, rel.lstrip("/")))

    @property
    def binary(self) -> str: return self.path("usr/local/bin/llmgw")
    @property
    def config(self) -> str: return self.path("etc/llmgw/agent.yaml")
    @property
    def ca(self) -> str: return self.path("etc/llmgw/pki/ca.crt")
    @property
    def cert(self) -> str: return self.path("etc/llmgw/pki/node.crt")
    @property
    def key(self) -> str: return self.path("etc/llmgw/pki/node.key")
    @property
    def unit(self) -> str: return self.path(f"etc/systemd/system/{UNIT_NAME}")
    @property
    def state_dir(self) -> str: return self.path("var/lib/llmgw/agent")
    @property
    def pex_root(self) -> str: return self.path("var/lib/llmgw/pex")
    @property
    def log(self) -> str: return self.path("var/log/llmgw-agent.log")
    @property
    def pidfile(self) -> str: return self.path("run/llmgw-agent.pid")

    def trust_anchor(self, style: str) -> str:
        return self.path(TRUST_ANCHOR[style])


@dataclass
class HostFacts:
    machine: str
    python: str | None                      # "3.11", or None without a python3
    trust: str | None                       # debian | rhel | None
    systemd: bool
    files: dict[str, tuple[str, str]] = field(default_factory=dict)   # path -> (sha256, octal mode)
    node_cert: bytes | None = None          # the node certificate already installed, if any


def render_config(layout: Layout, node: str, server: str, fabrics: list[str], nvidia_smi: str | None,
                  ib_root: str | None, logs_listen: str | None) -> bytes:
    cfg: dict[str, Any] = {"node": node, "server": server, "ca": layout.ca, "cert": layout.cert, "key": layout.key}
    if fabrics:
        cfg["fabrics"] = list(fabrics)
    if nvidia_smi:
        cfg["nvidia-smi"] = nvidia_smi
    if ib_root:
        cfg["ib-root"] = ib_root
    if logs_listen:
        cfg["logs-listen"] = logs_listen
    cfg["state-dir"] = layout.state_dir
    head = "# Written by llmgw-onboard-node; a re-run rewrites it. Keys: examples/agent.yaml.\n"
    return (head + yaml.safe_dump(cfg, sort_keys=False)).encode()


def render_unit(layout: Layout) -> bytes:
    """The agent's systemd unit: deploy/systemd/llmgw-agent.service (shipped as this package's
    units/, a link to it), its paths this layout's."""
    text = (UNITS / UNIT_NAME).read_text()
    reference = Layout("/")
    for field_ in ("binary", "config", "pex_root"):
        text = text.replace(getattr(reference, field_), getattr(layout, field_))
    if layout.root != "/":
        text = text.replace("StateDirectory=llmgw/agent", "# StateDirectory: under --root, made by onboarding")
    return f"# Written by llmgw-onboard-node from deploy/systemd/{UNIT_NAME}.\n{text}".encode()


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


class RemoteHost:
    def __init__(self, ssh: Ssh, layout: Layout, log: Callable[[str], object] = print) -> None:
        self.ssh = ssh
        self.layout = layout
        self.log = log
        self.facts: HostFacts | None = None

    # ------------------------------------------------------------------ probe
    def probe(self, paths: list[str]) -> HostFacts:
        """One round trip: machine, python3, trust tool, systemd, and hash/mode of each path."""
        q = " ".join(shlex.quote(p) for p in paths)
        script = f"""
echo "machine $(uname -m)"
if command -v python3 >/dev/null 2>&1; then
  echo "python $(python3 -c 'import sys; print("%d.%d" % sys.version_info[:2])')"
fi
if command -v update-ca-certificates >/dev/null 2>&1; then echo "trust debian"
elif command -v update-ca-trust >/dev/null 2>&1; then echo "trust rhel"; fi
if command -v systemctl >/dev/null 2>&1 && [ -d /run/systemd/system ]; then echo "systemd yes"; fi
for p in {q}; do
  if [ -f "$p" ]; then echo "file $p $(sha256sum "$p" | cut -d' ' -f1) $(stat -c %a "$p")"; fi
done
if [ -f {shlex.quote(self.layout.cert)} ]; then echo "nodecert $(base64 -w0 {shlex.quote(self.layout.cert)})"; fi
"""
        out = self.ssh.run(script).stdout
        facts = HostFacts(machine="", python=None, trust=None, systemd=False)
        for line in out.splitlines():
            word, _, rest = line.partition(" ")
            if word == "machine":
                facts.machine = rest.strip()
            elif word == "python":
                facts.python = rest.strip()
            elif word == "trust":
                facts.trust = rest.strip()
            elif word == "systemd":
                facts.systemd = True
            elif word == "file":
                path, digest, mode = rest.rsplit(" ", 2)
                facts.files[path] = (digest, mode)
            elif word == "nodecert":
                facts.node_cert = base64.b64decode(rest.strip())
        self.facts = facts
        return facts

    # ------------------------------------------------------------------ files
    def put(self, path: str, data: bytes, mode: int) -> bool:
        """Install `data` at `path` with `mode` unless it is there already; True if it wrote."""
        want = (sha256(data), format(mode, "o"))
        if self.facts is not None and self.facts.files.get(path) == want:
            self.log(f"  unchanged  {path}")
            return False
        script = f"""set -e
p={shlex.quote(path)}
mkdir -p "$(dirname "$p")"
tmp="$p.llmgw-new.$$"
trap 'rm -f "$tmp"' EXIT
(umask 077; cat > "$tmp")
[ "$(sha256sum "$tmp" | cut -d' ' -f1)" = {want[0]} ] || {{ echo "transfer of $p was corrupted" >&2; exit 1; }}
chmod {want[1]} "$tmp"
mv -f "$tmp" "$p"
"""
        self.ssh.run(script, input=data, timeout=900)
        if self.facts is not None:
            self.facts.files[path] = want
        self.log(f"  installed  {path} ({mode:04o})")
        return True

    # ------------------------------------------------------------------ trust
    def trust_root(self, ca_pem: bytes, style: str | None) -> bool:
        """Trust the CA root system-wide (Debian update-ca-certificates or RHEL update-ca-trust)."""
        if style is None:
            raise InstallError(f"{self.ssh.host} has neither update-ca-certificates (Debian, Ubuntu) nor "
                               "update-ca-trust (RHEL, Fedora): install the ca-certificates package")
        anchor = self.layout.trust_anchor(style)
        if not self.put(anchor, ca_pem, 0o644):
            return False
        r = self.layout.path
        if style == "debian":
            if self.layout.root == "/":
                cmd = "update-ca-certificates"
            else:   # the same tool, every directory under the install root
                dirs = {"--certsconf": r("etc/ca-certificates.conf"), "--certsdir": r("usr/share/ca-certificates"),
                        "--localcertsdir": r("usr/local/share/ca-certificates"),
                        "--etccertsdir": r("etc/ssl/certs"), "--hooksdir": r("etc/ca-certificates/update.d")}
                prep = " ".join(shlex.quote(d) for k, d in dirs.items() if k not in ("--certsconf",))
                cmd = (f"mkdir -p {prep} && touch {shlex.quote(dirs['--certsconf'])} && update-ca-certificates "
                       + " ".join(f"{k} {shlex.quote(v)}" for k, v in dirs.items()))
        else:
            cmd = "update-ca-trust extract" + ("" if self.layout.root == "/" else
                                                f" --output {shlex.quote(r('etc/pki/ca-trust/extracted'))}")
        self.ssh.run(cmd)
        self.log(f"  trusted    the llmgw CA root system-wide ({cmd.split(' && ')[-1].split()[0]})")
        return True


# ---------------------------------------------------------------- services

class ServiceManager:
    name = ""

    def __init__(self, host: RemoteHost):
        self.host = host

    def apply(self, changed: bool) -> str:
        raise NotImplementedError

    def logs_hint(self) -> str:
        raise NotImplementedError

    def tail(self, lines: int = 20) -> str:
        raise NotImplementedError


class Systemd(ServiceManager):
    name = "systemd"

    def apply(self, changed: bool) -> str:
        ssh, unit = self.host.ssh, UNIT_NAME
        if changed:
            ssh.run(f"systemctl daemon-reload && systemctl enable {unit} && systemctl restart {unit}")
            return "restarted"
        active = ssh.run(f"systemctl is-enabled --quiet {unit} && systemctl is-active --quiet {unit}",
                         check=False).returncode == 0
        if active:
            return "running, unchanged"
        ssh.run(f"systemctl enable {unit} && systemctl start {unit}")
        return "started"

    def logs_hint(self) -> str:
        return f"journalctl -u {UNIT_NAME} on {self.host.ssh.host}"

    def tail(self, lines: int = 20) -> str:
        out: str = self.host.ssh.run(f"journalctl -u {UNIT_NAME} -n {lines} --no-pager", check=False).stdout
        return out


class Direct(ServiceManager):
    """No init system: the agent runs under nohup; its pid is in run/llmgw-agent.pid."""
    name = "direct"

    def _running_pid(self) -> str:
        pidfile = shlex.quote(self.host.layout.pidfile)
        script = f'pid=$(cat {pidfile} 2>/dev/null) && [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null && echo "$pid"'
        out: str = self.host.ssh.run(script, check=False).stdout
        return out.strip()

    def apply(self, changed: bool) -> str:
        lay = self.host.layout
        pid = self._running_pid()
        if pid and not changed:
            return f"running (pid {pid}), unchanged"
        if pid:
            self.host.ssh.run(f"""kill {pid}; i=0
while kill -0 {pid} 2>/dev/null; do i=$((i+1)); [ $i -gt 150 ] && kill -9 {pid}; sleep 0.1; done""")
        q = shlex.quote
        self.host.ssh.run(f"""set -e
mkdir -p {q(posixpath.dirname(lay.log))} {q(posixpath.dirname(lay.pidfile))} {q(lay.state_dir)}
PEX_ROOT={q(lay.pex_root)} setsid nohup {q(lay.binary)} agent --config {q(lay.config)} \
  >> {q(lay.log)} 2>&1 < /dev/null &
echo $! > {q(lay.pidfile)}
sleep 2
""")
        new = self._running_pid()
        if not new:
            raise InstallError(f"the agent exited at once; its log {lay.log} on {self.host.ssh.host} ends:\n"
                               + self.tail())
        return ("restarted" if pid else "started") + f" (pid {new})"

    def logs_hint(self) -> str:
        return f"{self.host.layout.log} on {self.host.ssh.host}"

    def tail(self, lines: int = 20) -> str:
        out: str = self.host.ssh.run(f"tail -n {lines} {shlex.quote(self.host.layout.log)}", check=False).stdout
        return out


SERVICE_MANAGERS = {"systemd": Systemd, "direct": Direct}


def service_manager(kind: str, host: RemoteHost) -> ServiceManager:
    facts = host.facts
    if kind == "auto":
        kind = "systemd" if facts and facts.systemd else "direct"
    if kind == "systemd" and facts is not None and not facts.systemd:
        raise InstallError(f"{host.ssh.host} does not run systemd: use --service-manager direct")
    return SERVICE_MANAGERS[kind](host)


__all__ = ["Layout", "HostFacts", "RemoteHost", "InstallError", "SshError", "render_config", "render_unit",
           "service_manager", "SERVICE_MANAGERS", "sha256"]

# Shared by hack/up.sh and hack/test.sh: install what is missing on a Debian machine.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${LLMGW_VENV:-$ROOT/.venv}"

as_root() { if [[ $(id -u) -eq 0 ]]; then "$@"; else sudo "$@"; fi; }

ensure_debian_packages() {
  local missing=()
  for spec in "$@"; do            # spec: package:command-that-proves-it
    local pkg=${spec%%:*} cmd=${spec#*:}
    command -v "$cmd" >/dev/null 2>&1 || [[ -x $cmd ]] || missing+=("$pkg")
  done
  ((${#missing[@]})) || return 0
  echo "installing ${missing[*]} (Debian packages)" >&2
  export DEBIAN_FRONTEND=noninteractive
  as_root apt-get install -y -q "${missing[@]}" >/dev/null 2>&1 \
    || { as_root apt-get update -q >/dev/null && as_root apt-get install -y -q "${missing[@]}" >/dev/null; }
  # Debian starts etcd and Prometheus as services on install; llmgw runs its own.
  if command -v systemctl >/dev/null 2>&1; then
    [[ " ${missing[*]} " == *" etcd-server "* ]] && { as_root systemctl disable --now etcd >/dev/null 2>&1 || true; }
    [[ " ${missing[*]} " == *" prometheus "* ]] && { as_root systemctl disable --now prometheus >/dev/null 2>&1 || true; }
  fi
  return 0
}

ensure_venv() {
  local extra=${1:-}
  if [[ ! -x $VENV/bin/python ]]; then
    python3 -m venv "$VENV"
  fi
  # Reinstall only when pyproject.toml changed since the last install.
  local stamp="$VENV/.llmgw-installed$extra"
  if [[ ! -f $stamp || $ROOT/pyproject.toml -nt $stamp ]]; then
    "$VENV/bin/pip" install -q --disable-pip-version-check -e "$ROOT$extra" >&2
    touch "$stamp"
  fi
}

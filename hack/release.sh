#!/usr/bin/env bash
# Build llmgw release artifacts: one single-file executable (a PEX) per Linux
# architecture. Each one holds llmgw and every dependency as platform wheels
# for CPython 3.11 and later, so a node needs nothing but a python3 (3.11+):
#
#   scp dist/llmgw-0.2.0-linux-amd64.pex node:/usr/local/bin/llmgw
#   ssh node llmgw agent --config /etc/llmgw/agent.yaml
#
# Usage: hack/release.sh [-o OUTDIR] [-a amd64|arm64]... [-p 3.11|3.12|...]... [-f WHEELS]
#   -o  output directory (default: dist/)
#   -a  architecture; repeatable (default: amd64 and arm64)
#   -p  CPython version to carry wheels for; repeatable (default: 3.11 3.12 3.13)
#   -f  take the dependencies' wheels from the folder WHEELS only, not from the package
#       index (one `pip download` filled for those platforms: the tests keep one, and each
#       build then skips resolving them again from the index)
#
# Needs network access to PyPI (wheels for foreign platforms are downloaded,
# never built) and pex, which it installs into the current Python if missing.
# Writes OUTDIR/llmgw-VERSION-linux-ARCH.pex and OUTDIR/SHA256SUMS.
set -euo pipefail

here=$(cd "$(dirname "$0")/.." && pwd)
out="$here/dist"
arches=()
pythons=()
resolve=()
while getopts "o:a:p:f:h" opt; do
  case "$opt" in
    o) out=$(mkdir -p "$OPTARG" && cd "$OPTARG" && pwd) ;;
    a) arches+=("$OPTARG") ;;
    p) pythons+=("$OPTARG") ;;
    f) resolve=(--no-pypi -f "$(cd "$OPTARG" && pwd)") ;;
    h) sed -n '2,19p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) exit 2 ;;
  esac
done
[ ${#arches[@]} -gt 0 ] || arches=(amd64 arm64)
[ ${#pythons[@]} -gt 0 ] || pythons=(3.11 3.12 3.13)
machine_of() {
  case "$1" in
    amd64) echo x86_64 ;;
    arm64) echo aarch64 ;;
    *) echo "release: unknown architecture $1 (amd64 or arm64)" >&2; return 2 ;;
  esac
}
for arch in "${arches[@]}"; do machine_of "$arch" >/dev/null || exit 2; done
for v in "${pythons[@]}"; do
  [[ "$v" =~ ^3\.[0-9]+$ ]] || { echo "release: -p takes a version like 3.11, not $v" >&2; exit 2; }
done

py=${PYTHON:-}
if [ -z "$py" ]; then
  if [ -x "$here/.venv/bin/python" ]; then py="$here/.venv/bin/python"; else py=python3; fi
fi
if ! "$py" -m pex --version >/dev/null 2>&1; then
  echo "release: installing pex into $py" >&2
  "$py" -m pip install -q "pex>=2.30"
fi

version=$("$py" - "$here/pyproject.toml" <<'EOF'
import sys, tomllib
print(tomllib.load(open(sys.argv[1], "rb"))["project"]["version"])
EOF
)

build=$(mktemp -d)
trap 'rm -rf "$build"' EXIT
mkdir -p "$out"

# llmgw itself is pure Python: one wheel serves every platform. It is built
# from a copy of the sources, so a stale build/ directory in the checkout (or
# a concurrent build) cannot slip removed modules into it.
mkdir -p "$build/src"
(cd "$here" && tar -cf - --exclude=__pycache__ --exclude='*.pyc' pyproject.toml llmgw controllers \
  $(ls README.md 2>/dev/null)) | tar -xf - -C "$build/src"
"$py" -m pip wheel -q --no-deps -w "$build/wheels" "$build/src" >&2
wheel=$(ls "$build"/wheels/llmgw-*.whl)

for arch in "${arches[@]}"; do
  machine=$(machine_of "$arch")
  platforms=()
  for v in "${pythons[@]}"; do
    tag="${v/./}"
    # manylinux2014 = glibc 2.17 or later: any current distribution. The full
    # version (3.11.0, the lowest) lets pex evaluate python_full_version markers.
    platforms+=(--platform "manylinux2014_${machine}-cp-${v}.0-cp${tag}")
  done
  artifact="$out/llmgw-$version-linux-$arch.pex"
  echo "release: building $artifact for CPython ${pythons[*]}" >&2
  # --venv: on first run the PEX unpacks into a virtualenv under PEX_ROOT, so
  # sys.executable has every dependency (the agent can start `python -m ...`).
  "$py" -m pex "$wheel" \
    "${platforms[@]}" \
    "${resolve[@]}" \
    --console-script llmgw \
    --python-shebang "/usr/bin/env python3" \
    --venv \
    --no-emit-warnings \
    --no-build \
    --pip-version 25.3 \
    -o "$artifact"
done

(cd "$out" && sha256sum llmgw-"$version"-linux-*.pex > SHA256SUMS)
echo "release: done" >&2
ls -l "$out"/llmgw-"$version"-linux-*.pex

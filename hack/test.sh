#!/usr/bin/env bash
# Run llmgw's tests: installs etcd (Debian's etcd-server), sshd (for the
# onboarding test), Prometheus (its promtool parses the dashboards' PromQL),
# faketime (clock skew), nftables (the robustness suite's network faults) and a
# virtualenv with llmgw and its test dependencies when missing, then runs the
# checks (ruff; lint-imports, the import contracts in pyproject.toml; mypy,
# strict on the whole tree) and pytest: the tests not marked serial in parallel (pytest-xdist,
# LLMGW_TEST_WORKERS processes, 4 by default: they mostly wait on processes and sockets, and a
# file's tests stay together and in order on one), then the fault scenarios two at a time (each
# starts a whole cluster and mostly waits on its faults), then the serial ones alone (the
# timing-sensitive tests). Extra arguments go to every run (e.g. -k store).
source "$(dirname "$0")/lib.sh"
ensure_debian_packages etcd-server:etcd etcd-client:etcdctl openssh-server:/usr/sbin/sshd \
  ca-certificates:/usr/sbin/update-ca-certificates prometheus:/usr/bin/promtool faketime:/usr/bin/faketime \
  nftables:/usr/sbin/nft
ensure_venv "[test]"
# A real llama-server for tests/engines/test_real_llamacpp.py, built once per version and
# cached outside the checkout; without a compiler that test says so and is skipped.
if [[ -z ${LLMGW_LLAMA_SERVER:-} ]] && command -v cmake >/dev/null && command -v c++ >/dev/null; then
  LLMGW_LLAMA_SERVER=$(PYTHON="$VENV/bin/python" "$ROOT/hack/llama-server.sh")
  export LLMGW_LLAMA_SERVER
fi
cd "$ROOT"
# Where the environment sets PYTHONDONTWRITEBYTECODE (this machine's does), every pytest process
# rewrote every test module's asserts again at collection (about 6 s of CPU each: 4 workers and the
# serial run) and every process the tests start compiled llmgw again. __pycache__ is git-ignored.
unset PYTHONDONTWRITEBYTECODE
"$VENV/bin/ruff" check .
"$VENV/bin/lint-imports" --no-logo --no-cache
"$VENV/bin/mypy"
# pytest's status 5 is "no test selected": of one kind, when the arguments pick a few tests.
pytest() {
  local status=0
  # the slowest tests of each run, so a run that grows past the budget says where
  "$VENV/bin/python" -m pytest -q --durations=15 "$@" || status=$?
  return $((status == 5 ? 0 : status))
}
status=0
pytest -n "${LLMGW_TEST_WORKERS:-4}" --dist loadfile -m "not serial and not faults" "$@" || status=$?
pytest -n 2 --dist worksteal -m faults "$@" || status=$?
pytest -m serial "$@" || status=$?
exit "$status"

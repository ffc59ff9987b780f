#!/usr/bin/env bash
# Run llmgw's tests: installs etcd (Debian's etcd-server), sshd (for the
# onboarding test) and a virtualenv with llmgw and its test dependencies when
# missing, then runs pytest. Extra arguments go to pytest (e.g. -k store).
source "$(dirname "$0")/lib.sh"
ensure_debian_packages etcd-server:etcd etcd-client:etcdctl openssh-server:/usr/sbin/sshd \
  ca-certificates:/usr/sbin/update-ca-certificates
ensure_venv "[test]"
cd "$ROOT"
exec "$VENV/bin/python" -m pytest -q "$@"

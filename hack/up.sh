#!/usr/bin/env bash
# Bring up a whole local llmgw cluster: etcd, the API server, the
# controller-manager, the gateway and 4 agents with fake GPUs, all on loopback,
# all state under .llmgw-dev/. Ctrl-C (or `llmgw dev down`) stops everything.
# Arguments go to `llmgw dev up` (e.g. --nodes 6 --dir /tmp/llmgw).
source "$(dirname "$0")/lib.sh"
ensure_debian_packages etcd-server:etcd etcd-client:etcdctl
ensure_venv "[examples]"   # the openai client of the example `dev up` prints
cd "$ROOT"
exec "$VENV/bin/llmgw" dev up "$@"

#!/usr/bin/env bash
# On main: make the cluster match the repository.
set -euo pipefail
cd "$(dirname "$0")/.."
llmgw apply -f models/ -R --prune --selector llmgw.io/managed-by=gitops

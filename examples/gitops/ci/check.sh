#!/usr/bin/env bash
# On a pull request: refuse invalid manifests, then show what would change.
# `llmgw diff` exits 1 when the cluster differs from the repository (expected on
# a change), 0 when it is the same, and 2 or more on an error.
set -euo pipefail
cd "$(dirname "$0")/.."
llmgw apply -f models/ -R --dry-run
rc=0; llmgw diff -f models/ -R || rc=$?
[[ $rc -le 1 ]] || exit "$rc"

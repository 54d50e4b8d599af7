#!/usr/bin/env bash
# Builds helm from its Go module into the same versioned cache as the other binaries, and
# prints its path. The chart's lint and render tests (tests/integration/test_chart.py) and
# the chart's install on kind (hack/e2e-kind-helm.sh) use it. The first build takes about
# 80 s; later calls find it cached under its version.
set -euo pipefail
version=${HELM_VERSION:-v3.22.0}
cache_root=${MPIJOB_ELASTIC_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/mpijob-elastic}
bin_dir="$cache_root/bin/helm-$version"
binary="$bin_dir/helm"
mkdir -p "$bin_dir"
log() { printf '[build-helm %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
if [ -n "${HELM_BINARY:-}" ]; then
  [ -x "$HELM_BINARY" ] || { log "HELM_BINARY=$HELM_BINARY is not an executable"; exit 1; }
  echo "$HELM_BINARY"
  exit 0
fi
# Test sessions and the kind suite may ask at once; one builds, the others wait for it.
exec 9>"$cache_root/.helm.lock"
if ! flock -n 9; then
  log "waiting for another build-helm run to finish"
  flock 9
fi
if [ ! -x "$binary" ]; then
  start=$SECONDS
  log "go install helm.sh/helm/v3/cmd/helm@$version (first time only, about 80 s)"
  # helm's own Makefile stamps the version the same way; without it `helm version` says
  # v3.x-unreleased.
  CGO_ENABLED=0 GOBIN="$bin_dir" go install -trimpath \
    -ldflags "-s -w -X helm.sh/helm/v3/internal/version.version=$version" \
    "helm.sh/helm/v3/cmd/helm@$version" >&2
  log "built helm $version in $((SECONDS - start))s"
fi
echo "$binary"

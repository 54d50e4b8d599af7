#!/usr/bin/env bash
# Builds the scheduler-plugins scheduler (kube-scheduler with the Coscheduling plugin among
# others) from its Go module into the versioned cache, and prints the directory holding the
# binary `kube-scheduler-plugins`.
#
# The module cannot be `go install`ed: its go.mod points Kubernetes' staging modules at
# published tags with replace directives, which only a main module may carry. So, as
# hack/build-binaries.sh does for Kubernetes, a go.mod of ours requires the module and
# repeats its replace directives. Progress goes to stderr; stdout is only the directory.
# SCHEDULER_PLUGINS_BINARY points at a binary built elsewhere instead. `crd` prints the path
# of the module's PodGroup CRD instead, from the module's download, without waiting for a
# build under way: a test that needs the PodGroup API but not the scheduler goes on at once.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=versions.env
. "$here/versions.env"
version=$SCHEDULER_PLUGINS_VERSION
cache_root=${MPIJOB_ELASTIC_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/mpijob-elastic}
bin_dir="$cache_root/bin/scheduler-plugins-$version"
src_dir="$cache_root/src/scheduler-plugins-$version"
binary="$bin_dir/kube-scheduler-plugins"
mkdir -p "$bin_dir" "$src_dir"
log() { printf '[build-scheduler-plugins %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
case "${1:-}" in
  "") ;;
  crd)
    module_dir=$(go mod download -json "sigs.k8s.io/scheduler-plugins@$version" |
      python3 -c 'import json,sys; print(json.load(sys.stdin)["Dir"])')
    echo "$module_dir/manifests/coscheduling/crd.yaml"
    exit 0
    ;;
  *) echo "usage: $0 [crd]" >&2; exit 2 ;;
esac

# Test sessions may ask at once; one builds, the others wait for it.
exec 9>"$cache_root/.scheduler-plugins.lock"
if ! flock -n 9; then
  log "waiting for another build-scheduler-plugins run to finish"
  flock 9
fi

export CGO_ENABLED=0 GOFLAGS=-mod=mod
start=$SECONDS
module_json=$(go mod download -json "sigs.k8s.io/scheduler-plugins@$version")
gomod=$(python3 -c 'import json,sys; print(json.load(sys.stdin)["GoMod"])' <<<"$module_json")

if [ -n "${SCHEDULER_PLUGINS_BINARY:-}" ]; then
  [ -x "$SCHEDULER_PLUGINS_BINARY" ] || { log "SCHEDULER_PLUGINS_BINARY=$SCHEDULER_PLUGINS_BINARY is not an executable"; exit 1; }
  ln -sf "$SCHEDULER_PLUGINS_BINARY" "$binary"
fi

if [ ! -x "$binary" ]; then
  log "resolving sigs.k8s.io/scheduler-plugins $version (first time only; the log is $src_dir/build.log)"
  {
    echo "module mpijob-elastic/scheduler-plugins"
    echo
    echo "go 1.24.0"
    echo
    echo "require sigs.k8s.io/scheduler-plugins $version"
    echo
    # Both forms the module uses: inside a `replace (...)` block and one-line `replace x => y`.
    sed -n -e 's#^[[:space:]]*\(k8s.io/[^[:space:]]*\) => \(.*\)$#replace \1 => \2#p' \
      -e '/^replace [^(]/p' "$gomod" | sed 's/^replace replace /replace /' | sort -u
  } >"$src_dir/go.mod"
  cat >"$src_dir/tools.go" <<'GO'
//go:build tools

package tools

import _ "sigs.k8s.io/scheduler-plugins/cmd/scheduler"
GO
  if ! (cd "$src_dir" && go mod tidy) >"$src_dir/build.log" 2>&1; then
    tail -n 30 "$src_dir/build.log" >&2
    log "FAILED to resolve the module; build it by hand and set SCHEDULER_PLUGINS_BINARY"
    exit 1
  fi
  log "modules resolved in $((SECONDS - start))s; go build (several minutes on 2 cores)"
  if ! (cd "$src_dir" && go build -trimpath -ldflags "-s -w" -o "$binary.tmp" \
    sigs.k8s.io/scheduler-plugins/cmd/scheduler) >>"$src_dir/build.log" 2>&1; then
    tail -n 30 "$src_dir/build.log" >&2
    log "FAILED: go build; build it by hand and set SCHEDULER_PLUGINS_BINARY"
    exit 1
  fi
  mv "$binary.tmp" "$binary"
  log "built scheduler-plugins $version in $((SECONDS - start))s"
fi
echo "$bin_dir"

#!/usr/bin/env bash
# Builds Kueue's manager from its Go module into the same versioned cache as the Kubernetes
# binaries and prints its path; `hack/build-kueue.sh crds` prints the directory of the
# module's CRDs instead (the same download). The Kueue tests run it as a local process
# against the local cluster (tests/kueue.py).
set -euo pipefail
what=${1:-binary}
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck disable=SC1091
source "$here/versions.env"
version=${KUEUE_VERSION}
cache_root=${MPIJOB_ELASTIC_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/mpijob-elastic}
bin_dir="$cache_root/bin/kueue-$version"
binary="$bin_dir/kueue"
mkdir -p "$bin_dir"
exec 9>"$cache_root/.kueue.lock"
flock 9
if [ ! -x "$binary" ]; then
  echo "[build-kueue] go install sigs.k8s.io/kueue/cmd/kueue@$version" \
    "(about 4 minutes the first time)" >&2
  start=$SECONDS
  GOBIN="$bin_dir" go install -trimpath "sigs.k8s.io/kueue/cmd/kueue@$version" >&2
  echo "[build-kueue] kueue built in $((SECONDS - start)) s" >&2
fi
case "$what" in
  binary) echo "$binary" ;;
  crds)
    module_dir=$(go env GOMODCACHE)/sigs.k8s.io/kueue@$version
    [ -d "$module_dir" ] || GOFLAGS=-mod=mod go mod download "sigs.k8s.io/kueue@$version" >&2
    echo "$module_dir/config/components/crd/bases"
    ;;
  *) echo "usage: $0 [binary|crds]" >&2; exit 2 ;;
esac

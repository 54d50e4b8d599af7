#!/usr/bin/env bash
# Builds training-operator's v1 controller (the Go MPIJob controller users compare us with)
# from its Go module into the same versioned cache as the Kubernetes binaries, and prints
# its path. Only the side-by-side benchmark needs it (bench/sidebyside.py).
set -euo pipefail
version=${TRAINING_OPERATOR_VERSION:-v1.9.2}
cache_root=${MPIJOB_ELASTIC_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/mpijob-elastic}
bin_dir="$cache_root/bin/training-operator-$version"
binary="$bin_dir/training-operator.v1"
mkdir -p "$bin_dir"
exec 9>"$cache_root/.training-operator.lock"
flock 9
if [ ! -x "$binary" ]; then
  echo "[build-training-operator] go install training-operator $version" >&2
  GOBIN="$bin_dir" go install -trimpath \
    "github.com/kubeflow/training-operator/cmd/training-operator.v1@$version" >&2
fi
echo "$binary"

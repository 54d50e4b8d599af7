#!/usr/bin/env bash
# Stops the local cluster's processes and removes its files (certificates, etcd data,
# kubeconfig, logs). Safe to run when nothing is up.
set -euo pipefail
. "$(dirname "$0")/cluster-env.sh"
bin_dir=$("$here/build-binaries.sh")
if [ -d "$KWOK_WORKDIR/clusters/$cluster_name" ]; then
  "$bin_dir/kwokctl" delete cluster --name "$cluster_name" >/dev/null 2>&1 || true
  rm -rf "$KWOK_WORKDIR/clusters/$cluster_name"
fi
rm -f "$KWOK_WORKDIR/$cluster_name-up.log"
echo "cluster $cluster_name is down" >&2

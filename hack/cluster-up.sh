#!/usr/bin/env bash
# Starts (or finds running) a local KWOK cluster: etcd, kube-apiserver with RBAC,
# kube-controller-manager (garbage collector included), kube-scheduler and kwok as local
# processes, plus fake GPU nodes. Prints the kubeconfig path on stdout, progress on stderr.
set -euo pipefail
. "$(dirname "$0")/cluster-env.sh"
log() { printf '[cluster-up %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }

bin_dir=$("$here/build-binaries.sh")
export PATH="$bin_dir:$PATH" KWOK_KUBECTL_BINARY="$bin_dir/kubectl"

if [ -f "$kubeconfig" ] && kubectl --kubeconfig "$kubeconfig" get --raw /readyz >/dev/null 2>&1; then
  log "cluster $cluster_name is already up"
  echo "$kubeconfig"
  exit 0
fi
# A half-started or crashed cluster leaves processes and files behind: clear them first.
kwokctl delete cluster --name "$cluster_name" >/dev/null 2>&1 || true

start=$SECONDS
log "starting cluster $cluster_name (kube-apiserver, etcd, controller-manager, scheduler, kwok)"
config=$(mktemp)
trap 'rm -f "$config"' EXIT
cat "$bin_dir/kwok-default-stages.yaml" "$here/kwok/stages.yaml" \
  "$here/kwok/exec.yaml" "$here/kwok/components.yaml" >"$config"
# kwokctl logs JSON lines; keep them in a file and show them only if something fails.
log_file="$KWOK_WORKDIR/$cluster_name-up.log"
mkdir -p "$KWOK_WORKDIR"
# One try: the components, the nodes, and the default ServiceAccount, which the
# controller-manager makes a moment after a namespace exists (pods need it: waited for once
# here rather than in every test). kwokctl picks each component's ports at random and a
# component whose port another process took in the meantime dies at once
# ("bind: address already in use", seen with several clusters on one machine): the try
# fails within a bounded time and the next starts from a clean slate.
create() {
  kwokctl create cluster --name "$cluster_name" --runtime binary --config "$config" \
    --kube-authorization=true --kube-admission=true \
    --kube-apiserver-binary "$bin_dir/kube-apiserver" \
    --kube-controller-manager-binary "$bin_dir/kube-controller-manager" \
    --kube-scheduler-binary "$bin_dir/kube-scheduler" \
    --kwok-controller-binary "$bin_dir/kwok" \
    --etcd-binary "$bin_dir/etcd" \
    --wait 60s >"$log_file" 2>&1 8>&- || { cat "$log_file" >&2; log "kwokctl failed"; return 1; }
  kubectl --kubeconfig "$kubeconfig" apply -f "$here/kwok/nodes.yaml" >/dev/null || return 1
  kubectl --kubeconfig "$kubeconfig" wait --for=condition=Ready node --all --timeout=60s \
    >/dev/null || return 1
  local deadline=$((SECONDS + 90))
  until kubectl --kubeconfig "$kubeconfig" -n default get serviceaccount default >/dev/null 2>&1; do
    if [ "$SECONDS" -ge "$deadline" ]; then
      log "no default ServiceAccount after 90s; the components' last log lines:"
      tail -n 3 "$KWOK_WORKDIR/clusters/$cluster_name"/logs/*.log >&2 || true
      return 1
    fi
    sleep 0.2
  done
}
# One create at a time on this machine: kwokctl picks a port by finding it free, and a
# cluster created at the same moment can pick it too (seen with 4 test processes: an API
# server answering with another cluster's CA, then 3 failed tries of 3 min each). Once a
# cluster is up its ports are bound, and the next create cannot pick them. The components
# kwokctl leaves running must not inherit the lock (8>&-).
exec 8>"$KWOK_WORKDIR/create.lock"
if ! flock -n 8; then
  log "waiting for another cluster's start to finish"
  flock 8
fi
for attempt in 1 2 3; do
  create && break
  kwokctl delete cluster --name "$cluster_name" >/dev/null 2>&1 8>&- || true
  [ "$attempt" -lt 3 ] || { log "cluster $cluster_name did not come up in 3 tries"; exit 1; }
  log "cluster $cluster_name did not come up (try $attempt of 3): starting it again"
done
flock -u 8
log "cluster $cluster_name up in $((SECONDS - start))s; kubeconfig: $kubeconfig"
echo "$kubeconfig"

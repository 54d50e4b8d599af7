#!/usr/bin/env bash
# `make e2e-kind` (and the kind half of `make test`): the end-to-end suite on a real kind
# cluster. hack/kind-up.sh starts the cluster (on machines without a registry, from
# locally built images), hack/images.sh builds the controller, mock launcher, mock worker
# and kubectl images and loads them, the README's install steps run on a copy of config/
# (the controller image set in config/default's `images:` entry; write_install_overlay in
# kind/lib.sh) and `kubectl apply -k` installs it; the rollout waits for /readyz, which
# fails while the controller misses a permission. e2e/test_elastic.py and
# e2e/test_relocation.py (every worker on the kind worker node, cordoned then drained; the
# control plane, which takes pods too, is where the launcher and the replacements go) run
# with the launcher as a real pod: kubectl from the kubectl-delivery init container,
# /etc/mpi mounted by the kubelet, ranks started in real worker containers through
# kubexec.sh. Afterwards the
# controller is uninstalled, the Helm chart's run follows on the same cluster
# (hack/e2e-kind-helm.sh: install, PodDisruptionBudget, upgrade under a running job,
# uninstall) and the cluster is stopped (KEEP_CLUSTER=1 keeps the cluster and the kustomize
# install, and skips the chart's run).
set -euo pipefail
log_name=e2e-kind
# shellcheck source=kind/lib.sh
. "$(dirname "$0")/kind/lib.sh"
cd "$repo_root"
total=$SECONDS

kubeconfig=$("$kind_hack/kind-up.sh")
eval "$("$kind_hack/images.sh" | sed 's/^/export /')"
BIN_DIR=$(PATH="/usr/local/go/bin:$PATH" "$kind_hack/build-binaries.sh")
export PATH="$BIN_DIR:$PATH"
# Built now (about 80 s the first time), so that a build failure stops the run early.
PATH="/usr/local/go/bin:$PATH" "$kind_hack/build-helm.sh" >/dev/null
k() { kubectl --kubeconfig "$kubeconfig" "$@"; }

overlay=$(mktemp -d)
installed=0
uninstall() {
  log "uninstalling the controller"
  installed=0
  k delete -k "$overlay" --ignore-not-found --wait=true --timeout=120s >/dev/null 2>&1 || return 1
  # The uninstall takes everything the install made: nothing named for us may be left.
  left=$(k get crd,clusterrole,clusterrolebinding,validatingadmissionpolicy,validatingadmissionpolicybinding,namespace \
    -o name 2>/dev/null | grep -E 'mpijob' || true)
  [ -z "$left" ] || { log "the uninstall left: $left"; return 1; }
}
cleanup() {
  local rc=$?
  if [ $rc != 0 ] && [ $installed = 1 ]; then
    log "failed; the controller's log follows"
    # Both replicas: the leader has the story, the standby says whether it took over.
    k -n mpijob-elastic-system logs -l app.kubernetes.io/name=mpijob-elastic --prefix --tail=60 >&2 || true
  fi
  if [ "${KEEP_CLUSTER:-}" = 1 ]; then
    log "KEEP_CLUSTER=1: the cluster stays up; kubeconfig $kubeconfig"
  else
    if [ $installed = 1 ]; then uninstall || rc=1; fi
    "$kind_hack/kind-down.sh" || rc=1
  fi
  rm -rf "$overlay"
  log "done in $((SECONDS - total))s"
  exit $rc
}
trap cleanup EXIT

log "installing config/default (controller $MPIJOB_ELASTIC_IMAGE, kubectl ${E2E_KUBECTL_IMAGE:-default})"
write_install_overlay "$overlay"
installed=1
k apply -k "$overlay" >/dev/null
start=$SECONDS
k -n mpijob-elastic-system rollout status deployment/mpijob-elastic --timeout=180s >&2
log "controller available after $((SECONDS - start))s"

log "running the suite"
MPIJOB_ELASTIC_KUBECONFIG=$kubeconfig E2E_IN_CLUSTER=1 \
  "$repo_root/.venv/bin/python" -m pytest e2e/test_elastic.py e2e/test_relocation.py e2e/test_driver_rules.py "$@"

# After the suite, the install as an admin sees it (docs/operations.md): both replicas
# ready, one of them the Lease's holder, and the holder's /metrics declaring every series
# and counting its reconciles; the metrics Service answers too. The walk deletes the
# leader's pod mid-way, so what the new one saw since is only the walk's end: the values
# of every series are asserted on KWOK (tests/integration/test_observability.py).
ns=mpijob-elastic-system
ready=$(k -n $ns get deployment mpijob-elastic -o jsonpath='{.status.readyReplicas}')
[ "$ready" = 2 ] || { log "$ready of 2 replicas ready after the suite"; exit 1; }
holder=$(k -n $ns get lease mpijob-elastic -o jsonpath='{.spec.holderIdentity}')
leader=${holder%_*}
k -n $ns get pod "$leader" >/dev/null || { log "the Lease's holder $holder is no pod"; exit 1; }
metrics=$(k get --raw "/api/v1/namespaces/$ns/pods/$leader:8080/proxy/metrics")
# Every series the controller registers, read from its registry (tests/metric_names.py).
families=$("$repo_root/.venv/bin/python" -c \
  'from tests.metric_names import every_family; print(*every_family())')
for series in $families; do
  grep -qE "^# TYPE $series(_total)? " <<<"$metrics" || { log "no $series"; exit 1; }
done
for sample in 'reconciles_total{result="success"}' relists_total reconcile_duration_seconds_count; do
  grep -qF "mpijob_elastic_$sample" <<<"$metrics" || { log "no $sample on $leader"; exit 1; }
done
# Read whole before grep: `grep -q` stops at its match, and pipefail would count
# kubectl's broken pipe as a failure.
served=$(k get --raw "/api/v1/namespaces/$ns/services/mpijob-elastic-metrics:metrics/proxy/metrics")
grep -qE '^# TYPE mpijob_elastic_reconciles(_total)? ' <<<"$served" || { log "the metrics Service"; exit 1; }
log "2 replicas ready, $leader leads, its /metrics declares every series"

if [ "${KEEP_CLUSTER:-}" = 1 ]; then
  log "KEEP_CLUSTER=1: the kustomize install stays; the Helm chart's run is skipped"
  exit 0
fi
uninstall
# The same install as a Helm chart, on the same cluster (it cleans up after itself).
"$kind_hack/e2e-kind-helm.sh" "$kubeconfig"

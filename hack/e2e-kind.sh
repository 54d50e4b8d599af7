#!/usr/bin/env bash
# `make e2e-kind` (and the kind half of `make test`): the end-to-end suite on a real kind
# cluster. hack/kind-up.sh starts the cluster (on machines without a registry, from
# locally built images), hack/images.sh builds the controller, mock launcher, mock worker
# and kubectl images and loads them, the README's install steps run on a copy of config/
# (the controller image set in config/default's `images:` entry; write_install_overlay in
# kind/lib.sh) and `kubectl apply -k` installs it; the rollout waits for /readyz, which
# fails while the controller misses a permission. e2e/test_elastic.py and
# e2e/test_relocation.py (every worker on the kind worker node, cordoned then drained; the
# control plane, which takes pods too, is where the launcher and the replacements go) and
# e2e/test_capacity.py (CPU requests the scarce resource, a higher-priority pod preempts) and
# e2e/test_gang_kind.py (the scheduler-plugins coscheduling scheduler as a host process
# against this cluster, the Deployment patched with --gang-scheduler-name for it) and
# e2e/test_notices.py (the notice read from the kubelet's downwardAPI file in the real
# containers; the mock training's checkpoint on a hostPath across a stop) run
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
# Built beside the suite (about 80 s the first time), waited for only before the chart's
# run: under `make test` another build of it may hold its lock, and the suite waited 2 min
# for that at its start (2026-12-06, from nothing).
PATH="/usr/local/go/bin:$PATH" "$kind_hack/build-helm.sh" >/dev/null &
helm_build=$!
k() { kubectl --kubeconfig "$kubeconfig" "$@"; }

overlay=$(mktemp -d)
forward=""
installed=0
uninstall() {
  log "uninstalling the controller"
  installed=0
  k delete clusterrolebinding e2e-metrics-reader --ignore-not-found >/dev/null 2>&1 || true
  k delete -k "$overlay" --ignore-not-found --wait=true --timeout=120s >/dev/null 2>&1 || return 1
  # The uninstall takes everything the install made: nothing named for us may be left.
  left=$(k get crd,clusterrole,clusterrolebinding,validatingadmissionpolicy,validatingadmissionpolicybinding,namespace \
    -o name 2>/dev/null | grep -E 'mpijob' || true)
  [ -z "$left" ] || { log "the uninstall left: $left"; return 1; }
}
cleanup() {
  local rc=$?
  if [ -n "$forward" ]; then kill "$forward" 2>/dev/null || true; fi
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
  "$repo_root/.venv/bin/python" -m pytest e2e/test_elastic.py e2e/test_relocation.py e2e/test_driver_rules.py \
  e2e/test_capacity.py e2e/test_gang_kind.py e2e/test_notices.py "$@"

# After the suite, the install as an admin sees it (docs/operations.md): both replicas
# ready, one of them the Lease's holder, and the holder's /metrics declaring every series
# and counting its reconciles, to a token with the reader role only; the metrics Service
# answers too. The walk deletes the leader's pod mid-way, so what the new one saw since is
# only the walk's end: the values of every series are asserted on KWOK
# (tests/integration/test_observability.py).
ns=mpijob-elastic-system
ready=$(k -n $ns get deployment mpijob-elastic -o jsonpath='{.status.readyReplicas}')
[ "$ready" = 2 ] || { log "$ready of 2 replicas ready after the suite"; exit 1; }
holder=$(k -n $ns get lease mpijob-elastic -o jsonpath='{.spec.holderIdentity}')
leader=${holder%_*}
k -n $ns get pod "$leader" >/dev/null || { log "the Lease's holder $holder is no pod"; exit 1; }
# /metrics answers only a bearer token allowed to get it (docs/operations.md). The API
# server's proxy drops the caller's token, so the scrapes go through a port-forward from
# here, with tokens of two ServiceAccounts: one bound to the shipped reader role, one not.
k -n $ns create serviceaccount e2e-metrics-reader >/dev/null
k -n $ns create serviceaccount e2e-metrics-stranger >/dev/null
k create clusterrolebinding e2e-metrics-reader --clusterrole=mpijob-elastic-metrics-reader \
  --serviceaccount=$ns:e2e-metrics-reader >/dev/null
reader=$(k -n $ns create token e2e-metrics-reader --duration=10m)
stranger=$(k -n $ns create token e2e-metrics-stranger --duration=10m)
k -n $ns port-forward "pod/$leader" :8080 >"$overlay/port-forward.log" 2>&1 &
forward=$!
for _ in $(seq 300); do
  port=$(sed -n 's/^Forwarding from 127.0.0.1:\([0-9]*\) .*/\1/p' "$overlay/port-forward.log")
  [ -n "$port" ] && break
  sleep 0.1
done
[ -n "$port" ] || { log "no port-forward to $leader"; cat "$overlay/port-forward.log" >&2; exit 1; }
scrape() { # scrape [token]: the status; the body in $overlay/scraped
  curl -sk -o "$overlay/scraped" -w '%{http_code}' ${1:+-H "Authorization: Bearer $1"} \
    "https://127.0.0.1:$port/metrics"
}
no_token=$(scrape); refused=$(scrape "$stranger"); allowed=$(scrape "$reader")
kill "$forward"
forward=""
k delete clusterrolebinding e2e-metrics-reader >/dev/null
[ "$no_token $refused $allowed" = "401 403 200" ] ||
  { log "/metrics answered $no_token without a token, $refused without the role, $allowed with it (want 401 403 200)"; exit 1; }
metrics=$(cat "$overlay/scraped")
# Every series the controller registers, read from its registry (tests/metric_names.py).
families=$("$repo_root/.venv/bin/python" -c \
  'from tests.metric_names import every_family; print(*every_family())')
for series in $families; do
  grep -qE "^# TYPE $series(_total)? " <<<"$metrics" || { log "no $series"; exit 1; }
done
for sample in 'reconciles_total{result="success"}' relists_total reconcile_duration_seconds_count; do
  grep -qF "mpijob_elastic_$sample" <<<"$metrics" || { log "no $sample on $leader"; exit 1; }
done
# The Service reaches the guarded /metrics over TLS: through the API server's service proxy, which
# forwards no token, it answers 401, which kubectl reports as if its own credentials had
# failed (they did not: every call above used them).
served=$(k get --raw "/api/v1/namespaces/$ns/services/https:mpijob-elastic-metrics:metrics/proxy/metrics" 2>&1 || true)
grep -qF 'the server has asked for the client to provide credentials' <<<"$served" ||
  { log "the metrics Service answered: $served"; exit 1; }
log "2 replicas ready, $leader leads, its /metrics (401 without a token, 403 without the role) declares every series"
# The leader says it leads, and names the commit its image was built from (hack/images.sh
# passes it; docs/operations.md, "Version").
grep -qxF 'mpijob_elastic_is_leader 1.0' <<<"$metrics" || { log "is_leader is not 1 on $leader"; exit 1; }
grep -qE '^mpijob_elastic_build_info\{.*commit="[0-9a-f]{7,}' <<<"$metrics" ||
  { log "no commit in the build_info of $leader"; exit 1; }

if [ "${KEEP_CLUSTER:-}" = 1 ]; then
  log "KEEP_CLUSTER=1: the kustomize install stays; the Helm chart's run is skipped"
  exit 0
fi
uninstall
wait "$helm_build" || die "the helm build failed (hack/build-helm.sh)"
# The same install as a Helm chart, on the same cluster (it cleans up after itself).
"$kind_hack/e2e-kind-helm.sh" "$kubeconfig"

#!/usr/bin/env bash
# The Helm chart on kind: install, a PodDisruptionBudget that keeps a replica up, an
# upgrade that rolls the controller under a running elastic job (e2e/helm_rollout.py: 0
# restarts of training), and an uninstall that leaves nothing of the chart's. Called by
# hack/e2e-kind.sh once its kustomize install is uninstalled, on the same cluster, with the
# images of hack/images.sh in the environment; cleans up after itself. Usage:
# e2e-kind-helm.sh KUBECONFIG.
set -euo pipefail
log_name=e2e-kind-helm
# shellcheck source=kind/lib.sh
. "$(dirname "$0")/kind/lib.sh"
cd "$repo_root"
kubeconfig=$1
helm=$("$kind_hack/build-helm.sh")
k() { kubectl --kubeconfig "$kubeconfig" "$@"; }
h() { "$helm" --kubeconfig "$kubeconfig" "$@"; }
ns=mpijob-elastic-system
release=mpijob-elastic
total=$SECONDS

cleanup() {
  local rc=$?
  if [ $rc != 0 ]; then
    log "failed; the controller's log follows"
    k -n $ns logs -l app.kubernetes.io/name=mpijob-elastic --prefix --tail=60 >&2 || true
    h uninstall $release -n $ns --wait --timeout=120s >/dev/null 2>&1 || true
    k delete namespace $ns --ignore-not-found --wait=true --timeout=120s >/dev/null 2>&1 || true
    k delete crd mpijobs.kubeflow.org --ignore-not-found --wait=true --timeout=120s >/dev/null 2>&1 || true
  fi
  log "done in $((SECONDS - total))s"
  exit $rc
}
trap cleanup EXIT

# docs/operations.md, "Installing with Helm": the namespace first, with its Pod Security
# label (the chart does not create it), then the chart with the image.
k create namespace $ns >/dev/null
k label namespace $ns pod-security.kubernetes.io/enforce=restricted >/dev/null
image=(--set "image.repository=${MPIJOB_ELASTIC_IMAGE%:*}" --set "image.tag=${MPIJOB_ELASTIC_IMAGE##*:}")
# The kubectl-delivery image, where no registry serves the default (as write_install_overlay).
[ -z "${E2E_KUBECTL_IMAGE:-}" ] || image+=(--set "extraArgs={--kubectl-image=$E2E_KUBECTL_IMAGE}")
log "helm install $release (controller $MPIJOB_ELASTIC_IMAGE)"
start=$SECONDS
h install $release charts/mpijob-elastic -n $ns "${image[@]}" --wait --timeout=180s >/dev/null
k -n $ns rollout status deployment/mpijob-elastic --timeout=60s >&2
log "installed and rolled out in $((SECONDS - start))s on nodes:" \
  "$(k -n $ns get pods -l app.kubernetes.io/name=mpijob-elastic -o jsonpath='{.items[*].spec.nodeName}')"

# The PodDisruptionBudget: one eviction goes through, a second one right after is refused
# (429) while the first pod's replacement is not ready, as a node drain would see it.
allowed() { k -n $ns get pdb mpijob-elastic -o jsonpath='{.status.disruptionsAllowed}'; }
for _ in $(seq 60); do [ "$(allowed)" = 1 ] && break; sleep 1; done
[ "$(allowed)" = 1 ] || die "the PodDisruptionBudget allows $(allowed) disruptions, not 1"
evict() {
  k create --raw "/api/v1/namespaces/$ns/pods/$1/eviction" -f - <<JSON
{"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": "$1", "namespace": "$ns"}}
JSON
}
read -r -a pods <<<"$(k -n $ns get pods -l app.kubernetes.io/name=mpijob-elastic -o jsonpath='{.items[*].metadata.name}')"
[ ${#pods[@]} = 2 ] || die "${#pods[@]} controller pods, not 2"
evict "${pods[0]}" >/dev/null || die "the first eviction was refused"
if refused=$(evict "${pods[1]}" 2>&1); then die "the second eviction went through: both replicas gone"; fi
grep -q "disruption budget" <<<"$refused" || die "the second eviction failed otherwise: $refused"
log "the PodDisruptionBudget let ${pods[0]} go and kept ${pods[1]}"
k -n $ns rollout status deployment/mpijob-elastic --timeout=120s >&2

# The upgrade under a running elastic job: a changed value (the CPU request) rolls both
# pods; e2e/helm_rollout.py asserts what training saw.
log "helm upgrade $release under a running elastic job"
"$repo_root/.venv/bin/python" -m e2e.helm_rollout --kubeconfig "$kubeconfig" \
  --kubectl "$(command -v kubectl)" --helm "$helm" --release $release --namespace $ns \
  --launcher-image "$E2E_LAUNCHER_IMAGE" --worker-image "$E2E_WORKER_IMAGE" -- \
  charts/mpijob-elastic -n $ns --reuse-values --set resources.requests.cpu=150m \
  --wait --timeout=300s
[ "$(k -n $ns get deployment mpijob-elastic -o jsonpath='{.spec.template.spec.containers[0].resources.requests.cpu}')" = 150m ] ||
  die "the upgrade did not reach the Deployment"

# Uninstall: every object the chart made goes. Helm keeps the CRD by design (crds/ is
# never deleted: deleting it would delete every MPIJob), and the namespace, which the
# chart did not create; in it, only the Lease the controller made.
log "helm uninstall $release"
h uninstall $release -n $ns --cascade=foreground --wait --timeout=120s >/dev/null
left=$(k get clusterrole,clusterrolebinding,validatingadmissionpolicy,validatingadmissionpolicybinding \
  -o name | grep -E 'mpijob' || true)
left+=$(k -n $ns get deployment,replicaset,pod,service,poddisruptionbudget,serviceaccount,role,rolebinding,configmap \
  -o name | grep -vE '^(serviceaccount/default|configmap/kube-root-ca.crt)$' || true)
[ -z "$left" ] || die "helm uninstall left: $left"
leases=$(k -n $ns get lease -o name)
[ "$leases" = lease.coordination.k8s.io/mpijob-elastic ] || die "leases left: $leases"
# Released by the leader's SIGTERM unless its RBAC went first: Helm deletes the rest while
# the pods terminate. Either way the Lease expires; the namespace's deletion removes it.
log "the Lease is left, holder '$(k -n $ns get lease mpijob-elastic -o jsonpath='{.spec.holderIdentity}')'"
k get crd mpijobs.kubeflow.org -o name >/dev/null || die "helm uninstall removed the CRD"
# What the docs say to do by hand; then nothing named for us is left, as after kustomize.
k delete namespace $ns --wait=true --timeout=120s >/dev/null
k delete crd mpijobs.kubeflow.org --wait=true --timeout=120s >/dev/null
left=$(k get crd,clusterrole,clusterrolebinding,validatingadmissionpolicy,validatingadmissionpolicybinding,namespace \
  -o name | grep -E 'mpijob' || true)
[ -z "$left" ] || die "left after the uninstall: $left"
log "uninstalled: the chart's objects gone, the CRD and namespace removed by hand"

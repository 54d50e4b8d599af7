#!/usr/bin/env bash
# A quick check that the kind cluster of hack/kind-up.sh runs the project for real: a pod of
# the mock worker image answers `kubectl exec`; `kubectl apply -k config/default` (plus a
# throwaway overlay that sets the image and --kubectl-image) gets the controller Running;
# an elastic MPIJob of the mock images gets a real launcher (kubectl from the
# kubectl-delivery init container, /etc/mpi mounted by the kubelet) whose mock driver
# starts ranks in the workers through kubexec.sh; a scale to 3 workers reaches the
# launcher's mounted discover_hosts.sh. Removes what it created. Not a test suite: the
# e2e suite is `make e2e-kind`.
set -euo pipefail
log_name=kind-smoke
# shellcheck source=lib.sh
. "$(dirname "$0")/lib.sh"

kubeconfig=$("$kind_hack/kind-up.sh")
eval "$("$kind_hack/images.sh" | sed 's/^/export /')"
BIN_DIR=$(PATH="/usr/local/go/bin:$PATH" "$kind_hack/build-binaries.sh")
k() { "$BIN_DIR/kubectl" --kubeconfig "$kubeconfig" "$@"; }
ns=kind-smoke
ok=0
overlay=$(mktemp -d)
cleanup() {
  if [ "$ok" != 1 ]; then
    log "failed; the controller's log and the namespace's events follow"
    k -n mpijob-elastic-system logs -l app.kubernetes.io/name=mpijob-elastic --prefix --tail=40 >&2 || true
    k -n "$ns" get events --sort-by=.lastTimestamp >&2 || true
  fi
  [ "${KEEP:-}" != 1 ] || { log "KEEP=1: leaving namespace $ns and the controller installed"; return; }
  k delete namespace "$ns" --ignore-not-found --wait=false >/dev/null 2>&1 || true
  k delete -k "$overlay" --ignore-not-found >/dev/null 2>&1 || true
  rm -rf "$overlay"
}
trap cleanup EXIT
k create namespace "$ns" >/dev/null

log "worker pod + kubectl exec"
k -n "$ns" run worker-check --image="$E2E_WORKER_IMAGE" --restart=Never >/dev/null
k -n "$ns" wait --for=condition=Ready pod/worker-check --timeout=60s >/dev/null
k -n "$ns" exec worker-check -- /usr/local/bin/python3 -c 'import e2e.mockhorovod.rank' 2>/dev/null ||
  k -n "$ns" exec worker-check -- sh -c 'cd /opt/mockhorovod && /usr/local/bin/python3 -c "import e2e.mockhorovod.rank; print(\"exec ok\")"'
k -n "$ns" delete pod worker-check --wait=false >/dev/null

log "controller from config/default (image $MPIJOB_ELASTIC_IMAGE)"
write_install_overlay "$overlay"
k apply -k "$overlay" >/dev/null
start=$SECONDS
k -n mpijob-elastic-system rollout status deployment/mpijob-elastic --timeout=180s >/dev/null
log "controller Running after $((SECONDS - start))s"

log "elastic MPIJob of the mock images"
k -n "$ns" apply -f - >/dev/null <<EOF
apiVersion: kubeflow.org/v1
kind: MPIJob
metadata:
  name: smoke
  annotations:
    mpijob-elastic.io/min-replicas: "1"
    mpijob-elastic.io/max-replicas: "3"
spec:
  slotsPerWorker: 1
  runPolicy:
    cleanPodPolicy: Running
  mpiReplicaSpecs:
    Launcher:
      replicas: 1
      template:
        spec:
          containers:
            - name: launcher
              image: $E2E_LAUNCHER_IMAGE
              command: [horovodrun, -np, "2", --min-np, "1", --max-np, "3",
                        --host-discovery-script, /etc/mpi/discover_hosts.sh,
                        --rank-repo, /opt/mockhorovod, --rank-python, /usr/local/bin/python3,
                        --stop-file, /tmp/stop-training]
    Worker:
      replicas: 2
      template:
        spec:
          containers:
            - name: worker
              image: $E2E_WORKER_IMAGE
EOF
start=$SECONDS
until k -n "$ns" logs smoke-launcher 2>/dev/null | grep '"job_started"' >/dev/null; do
  [ $((SECONDS - start)) -lt 120 ] || { k -n "$ns" get pods >&2; k -n "$ns" logs smoke-launcher --all-containers >&2 || true; die "no job_started within 120s"; }
  sleep 1
done
log "launcher's mock driver started 2 ranks after $((SECONDS - start))s"
k -n "$ns" patch mpijob smoke --type=merge -p '{"spec":{"mpiReplicaSpecs":{"Worker":{"replicas":3}}}}' >/dev/null
start=$SECONDS
until [ "$(k -n "$ns" exec smoke-launcher -- sh -c 'grep -c : /etc/mpi/discover_hosts.sh' 2>/dev/null)" = 3 ]; do
  [ $((SECONDS - start)) -lt 120 ] || die "discover_hosts.sh did not list 3 hosts within 120s"
  sleep 0.5
done
log "scale to 3: the launcher's mounted discover_hosts.sh lists 3 hosts after $((SECONDS - start))s"
k -n "$ns" exec smoke-launcher -- touch /tmp/stop-training
k -n "$ns" logs smoke-launcher | tail -n 3 >&2
ok=1
log "smoke passed"

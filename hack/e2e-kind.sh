#!/usr/bin/env bash
# `make e2e-kind`: the end-to-end suite on a kind cluster, for anyone with Docker and kind.
# Builds the controller and mock images, loads them into kind, deploys config/default, and
# runs e2e/test_elastic.py with the launcher as a real pod. KEEP_CLUSTER=1 keeps the cluster.
set -euo pipefail
cd "$(dirname "$0")/.."
for tool in docker kind; do
  command -v "$tool" >/dev/null || { echo "e2e-kind needs $tool on PATH" >&2; exit 1; }
done
name=${KIND_CLUSTER:-mpijob-elastic-e2e}
tag=e2e
controller=mpijob-elastic:$tag launcher=mpijob-elastic/mock-launcher:$tag worker=mpijob-elastic/mock-worker:$tag
bin_dir=$(hack/build-binaries.sh)
export PATH="$bin_dir:$PATH"
log() { printf '[e2e-kind %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }

kind get clusters | grep -qx "$name" || { log "creating kind cluster $name"; kind create cluster --name "$name" --wait 120s; }
kubeconfig=$(mktemp)
trap 'rm -f "$kubeconfig"; [ "${KEEP_CLUSTER:-}" = 1 ] || kind delete cluster --name "$name"' EXIT
kind get kubeconfig --name "$name" >"$kubeconfig"

log "building images"
docker build -q -t "$controller" .
docker build -q -f e2e/images/launcher/Dockerfile -t "$launcher" .
docker build -q -f e2e/images/worker/Dockerfile -t "$worker" .
for image in "$controller" "$launcher" "$worker"; do kind load docker-image --name "$name" "$image"; done

log "deploying config/default"
k() { kubectl --kubeconfig "$kubeconfig" "$@"; }
k apply -k config/default
# The mock launcher ships kubectl, so no kubectl-delivery init container (and no image
# pull from outside) is needed.
k -n mpijob-elastic-system patch deployment mpijob-elastic --type=json -p "[
  {\"op\": \"replace\", \"path\": \"/spec/template/spec/containers/0/image\", \"value\": \"$controller\"},
  {\"op\": \"add\", \"path\": \"/spec/template/spec/containers/0/args/-\", \"value\": \"--kubectl-delivery=none\"}]"
k -n mpijob-elastic-system rollout status deployment/mpijob-elastic --timeout=180s

log "running the suite"
MPIJOB_ELASTIC_KUBECONFIG=$kubeconfig E2E_IN_CLUSTER=1 \
  E2E_LAUNCHER_IMAGE=$launcher E2E_WORKER_IMAGE=$worker \
  .venv/bin/python -m pytest e2e/test_elastic.py

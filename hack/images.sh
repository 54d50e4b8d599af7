#!/usr/bin/env bash
# Builds the project's images and loads them into the kind cluster of hack/kind-up.sh
# (started first if it is not up):
#   the controller (Dockerfile), the mock launcher and mock worker (e2e/images/), and a
#   kubectl image for the controller's --kubectl-image (busybox + kubectl).
# Prints their references as KEY=VALUE lines on stdout (also written to
# $run_dir/images.env, for `set -a; . file`); progress goes to stderr.
#
# Tags are chosen here, at run time, from a hash of each image's inputs: nothing local is
# ever written into a manifest. IMAGE_BASES=local (the default unless
# KIND_NODE_IMAGE=official) builds on the locally made bases of hack/kind-up.sh, for
# machines without a registry; IMAGE_BASES=official builds on the Dockerfile's pinned
# python:3.11-slim and registry.k8s.io/kubectl as a user would. NO_LOAD=1 builds without
# loading into kind.
set -euo pipefail
log_name=images
# shellcheck source=kind/lib.sh
. "$(dirname "$0")/kind/lib.sh"
# shellcheck source=kind/local-images.sh
. "$kind_hack/kind/local-images.sh"

if [ "${KIND_NODE_IMAGE:-local}" = official ]; then bases=${IMAGE_BASES:-official}; else bases=${IMAGE_BASES:-local}; fi
total=$SECONDS

if [ "${NO_LOAD:-}" = 1 ]; then
  use_docker
  [ "$mode" != private ] || dockerd_pid >/dev/null || die "our dockerd is not running: run hack/kind-up.sh first"
else
  kubeconfig=$("$kind_hack/kind-up.sh")
  [ "$kubeconfig" = "$kubeconfig_path" ] || die "kind-up.sh printed $kubeconfig, expected $kubeconfig_path"
  use_docker
fi
export BIN_DIR
BIN_DIR=$(PATH="/usr/local/go/bin:$PATH" "$kind_hack/build-binaries.sh")

if [ "$bases" = local ]; then
  base_image_names
  ensure_python_base || die "python base image"
  ensure_kubectl_image || die "kubectl image"
  python_base=$PYTHON_BASE
  kubectl_base=$KUBECTL_IMAGE
  kubectl_image=$KUBECTL_IMAGE
else
  # The controller Dockerfile's pinned default, so the mock images share its base.
  python_base=$(sed -n 's/^ARG BASE_IMAGE=//p' "$repo_root/Dockerfile")
  kubectl_base=registry.k8s.io/kubectl:$KUBE_VERSION
  # The kubectl-delivery init container needs a shell; the official kubectl image has none.
  kubectl_image=""
fi

# A tag from the hash of what goes into an image: its base image's ID, its Dockerfile and
# the files it copies.
content_tag() {
  local base_id=$1; shift
  {
    echo "$base_id"
    (cd "$repo_root" && find "$@" -type f ! -path '*/__pycache__/*' ! -name '*.pyc' -print0 |
      sort -z | xargs -0 sha256sum)
  } | sha256sum | cut -c1-12
}
base_id() {
  docker image inspect -f '{{.Id}}' "$1" 2>/dev/null || { docker pull -q "$1" >/dev/null && docker image inspect -f '{{.Id}}' "$1"; }
}

# build NAME REPO DOCKERFILE BUILD_ARGS... -- FILES...: builds REPO:<content tag> unless present.
build() {
  local name=$1 repo=$2 dockerfile=$3 args=() files=() tag old
  shift 3
  while [ $# -gt 0 ] && [ "$1" != -- ]; do args+=("$1"); shift; done
  shift
  files=("$@")
  tag="$repo:kind-$(content_tag "$(base_id "$python_base")$(base_id "$kubectl_base")" "$dockerfile" "${files[@]}")"
  if docker image inspect "$tag" >/dev/null 2>&1; then
    log "$name: $tag (cached)"
  else
    timed "image-$name" docker build -f "$repo_root/$dockerfile" "${args[@]}" -t "$tag" "$repo_root" ||
      die "docker build of $name"
    # Earlier builds of this image (other sources) only take disk space now.
    old=$(docker image ls "$repo" --format '{{.Repository}}:{{.Tag}}' | grep -E ":kind-[0-9a-f]{12}\$" | grep -vxF "$tag" || true)
    [ -z "$old" ] || docker rmi $old >/dev/null 2>&1 || true
  fi
  echo "$tag"
}

# The commit goes into the image (app/build.py) but not into the content tag: an image of
# the same sources is reused, and says the commit it was first built from.
commit=$(git -C "$repo_root" describe --always --dirty --abbrev=12 2>/dev/null || true)
controller=$(build controller mpijob-elastic Dockerfile --build-arg "BASE_IMAGE=$python_base" \
  --build-arg "COMMIT=$commit" -- requirements.lock pyproject.toml README.md mpijob_elastic)
launcher=$(build launcher mpijob-elastic/mock-launcher e2e/images/launcher/Dockerfile \
  --build-arg "BASE_IMAGE=$python_base" --build-arg "KUBECTL_IMAGE=$kubectl_base" \
  -- e2e/images/launcher e2e/mockhorovod contrib/mpijob_elastic_notice.py)
worker=$(build worker mpijob-elastic/mock-worker e2e/images/worker/Dockerfile \
  --build-arg "BASE_IMAGE=$python_base" -- e2e/images/worker e2e/mockhorovod contrib/mpijob_elastic_notice.py)

# Loads an image into the node unless the node's containerd has it already (kind's own
# check needs crictl, which our node image lacks).
load() {
  local image=$1 ref
  case $image in
    */*/*) ref=$image ;;
    */*) [[ ${image%%/*} == *.* ]] && ref=$image || ref="docker.io/$image" ;;
    *) ref="docker.io/library/$image" ;;
  esac
  if grep -qxF "$ref" <<<"$node_images"; then
    log "$image already in the node"
    return 0
  fi
  timed "load-${image//[\/:]/_}" kind load docker-image --name "$cluster_name" "$image" || die "kind load docker-image $image"
}
if [ "${NO_LOAD:-}" != 1 ]; then
  node_images=$(docker exec "$cluster_name-control-plane" ctr -n k8s.io images ls -q)
  for image in "$controller" "$launcher" "$worker" ${kubectl_image:+"$kubectl_image"}; do load "$image"; done
fi

mkdir -p "$run_dir"
{
  echo "MPIJOB_ELASTIC_IMAGE=$controller"
  echo "E2E_LAUNCHER_IMAGE=$launcher"
  echo "E2E_WORKER_IMAGE=$worker"
  echo "E2E_KUBECTL_IMAGE=$kubectl_image"
} | tee "$run_dir/images.env"
log "images ready in $((SECONDS - total))s (also in $run_dir/images.env)"

# Builds what a kind cluster needs on a machine with no container registry: static helper
# programs, the locally made base images, and the kind node image made from our own
# Kubernetes binaries. Sourced by hack/kind-up.sh and hack/images.sh after hack/kind/lib.sh
# and use_docker. Every image carries a label with the hash of its recipe and inputs; a
# build is skipped when the tag exists with that label, so reruns cost seconds.
# shellcheck shell=bash

recipe_label=mpijob-elastic.recipe

image_recipe() { docker image inspect -f "{{index .Config.Labels \"$recipe_label\"}}" "$1" 2>/dev/null; }

# ensure_image TAG HASH NAME CMD...: runs CMD (which must label TAG with HASH) unless TAG
# already exists with that label.
ensure_image() {
  local tag=$1 hash=$2 name=$3; shift 3
  if [ "$(image_recipe "$tag")" = "$hash" ]; then
    log "$name: $tag (cached)"
    return 0
  fi
  timed "$name" "$@" || return 1
  [ "$(image_recipe "$tag")" = "$hash" ] || die "$name did not produce $tag labelled $hash"
}

go_env() { env PATH="/usr/local/go/bin:$PATH" CGO_ENABLED=0 GOFLAGS=-mod=mod "$@"; }

# kind at the pinned version, and hack/kind/tools (pause, runc-nocap), into $tools_bin.
ensure_tools() {
  local stamp
  mkdir -p "$tools_bin"
  if [ ! -x "$tools_bin/kind" ]; then
    timed "kind-$KIND_VERSION" go_env GOBIN="$tools_bin" go install -trimpath -ldflags "-s -w" \
      "sigs.k8s.io/kind@$KIND_VERSION" || die "go install sigs.k8s.io/kind@$KIND_VERSION"
  fi
  stamp="$tools_bin/.tools-$(recipe_hash "$kind_hack"/kind/tools/go.mod "$kind_hack"/kind/tools/*/*.go)"
  if [ ! -e "$stamp" ]; then
    timed kind-tools bash -c "cd '$kind_hack/kind/tools' && $(declare -f go_env); go_env go build -trimpath -ldflags '-s -w' -o '$tools_bin/' ./..." ||
      die "go build of hack/kind/tools"
    rm -f "$tools_bin"/.tools-* && touch "$stamp"
  fi
}

# coredns at the kubeadm-chosen version, from the Go module proxy.
coredns_bin() { echo "$kind_cache/bin/coredns-$KIND_COREDNS_VERSION/coredns"; }
ensure_coredns() {
  local dir
  dir=$(dirname "$(coredns_bin)")
  [ -x "$dir/coredns" ] && return 0
  mkdir -p "$dir"
  timed "coredns-$KIND_COREDNS_VERSION" go_env GOBIN="$dir" go install -trimpath -ldflags "-s -w" \
    "github.com/coredns/coredns@$KIND_COREDNS_VERSION"
}

# --- base images -------------------------------------------------------------------------

host_cas() { compgen -G '/usr/local/share/ca-certificates/*.crt' || true; }
debian_mirror=${KIND_DEBIAN_MIRROR:-http://deb.debian.org/debian}

# A minimal Debian (what debian:<suite>-slim is upstream) made by debootstrap, trusting the
# host's extra CA certificates, imported as an image.
build_debian_base() {
  local tag=$1 hash=$2 dir="$work_dir/debian-rootfs" crt
  unmount_under "$dir"
  rm -rf "$dir"
  mkdir -p "$work_dir"
  debootstrap --variant=minbase --include=ca-certificates "$KIND_DEBIAN_SUITE" "$dir" "$debian_mirror"
  cat >"$dir/etc/apt/sources.list" <<EOF
deb $debian_mirror $KIND_DEBIAN_SUITE main
deb $debian_mirror $KIND_DEBIAN_SUITE-updates main
deb ${debian_mirror%/debian}/debian-security $KIND_DEBIAN_SUITE-security main
EOF
  for crt in $(host_cas); do cp "$crt" "$dir/usr/local/share/ca-certificates/"; done
  chroot "$dir" update-ca-certificates
  chroot "$dir" apt-get clean
  rm -rf "$dir"/var/lib/apt/lists/* "$dir"/var/cache/apt/*.bin "$dir"/var/log/*.log "$dir"/tmp/*
  unmount_under "$dir"
  tar -C "$dir" --numeric-owner -c . | docker import \
    --change "LABEL $recipe_label=$hash" \
    --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
    --change 'ENV LANG=C.UTF-8' \
    --change 'CMD ["/bin/bash"]' - "$tag"
  rm -rf "$dir"
}

# Leaves no mount behind under a directory (debootstrap mounts proc and sys in its target).
unmount_under() {
  local m
  for m in $(awk -v d="$1" '$2 == d || index($2, d "/") == 1 {print $2}' /proc/self/mounts | sort -r); do
    umount -l "$m" || true
  done
}

build_python_base() {
  local tag=$1 hash=$2
  docker build --label "$recipe_label=$hash" --build-arg "BASE_IMAGE=$DEBIAN_BASE" \
    -t "$tag" "$kind_hack/kind/python-base"
}

build_node_base() {
  local tag=$1 hash=$2 ctx="$work_dir/node-base" kind_dir
  kind_dir=$(go_env go mod download -json "sigs.k8s.io/kind@$KIND_VERSION" |
    python3 -c 'import json,sys; print(json.load(sys.stdin)["Dir"])')
  rm -rf "$ctx" && mkdir -p "$ctx/files/usr/local/sbin" "$ctx/files/usr/local/bin"
  cp -r "$kind_dir/images/base/files/." "$ctx/files/"
  # The module cache is read-only; give the files the modes kind's Dockerfile gives them.
  chmod -R u+w "$ctx"
  find "$ctx/files" -type d -exec chmod 0755 {} +
  find "$ctx/files" -type f -exec chmod 0644 {} +
  chmod 0755 "$ctx"/files/usr/local/bin/* "$ctx"/files/kind/bin/*
  install -m 0755 "$kind_hack/kind/node-base/ctr" "$ctx/files/usr/local/bin/ctr"
  install -m 0755 "$tools_bin/runc-nocap" "$ctx/files/usr/local/sbin/runc"
  cp "$kind_hack/kind/node-base/Dockerfile" "$ctx/"
  docker build --label "$recipe_label=$hash" --build-arg "BASE_IMAGE=$DEBIAN_BASE" \
    --build-arg "PAUSE_IMAGE=registry.k8s.io/pause:$KIND_PAUSE_VERSION" -t "$tag" "$ctx"
  rm -rf "$ctx"
}

# Computes the base image tags and their recipe hashes (cheap; no builds).
base_image_names() {
  DEBIAN_BASE="mpijob-elastic.local/debian:$KIND_DEBIAN_SUITE"
  DEBIAN_BASE_HASH=$(recipe_hash "$(declare -f build_debian_base)" "$debian_mirror" $(host_cas))
  PYTHON_BASE="mpijob-elastic.local/python:3-$KIND_DEBIAN_SUITE"
  PYTHON_BASE_HASH=$(recipe_hash "$DEBIAN_BASE_HASH" "$kind_hack/kind/python-base/Dockerfile")
  NODE_BASE="mpijob-elastic.local/kind-base:$KIND_VERSION-$KIND_DEBIAN_SUITE"
  NODE_BASE_HASH=$(recipe_hash "$DEBIAN_BASE_HASH" "$(declare -f build_node_base)" \
    "$kind_hack/kind/node-base/Dockerfile" "$kind_hack/kind/node-base/ctr" \
    "$kind_hack/kind/tools/runc-nocap/main.go" "$KIND_VERSION" "$KIND_PAUSE_VERSION")
}

ensure_debian_base() {
  base_image_names
  ensure_image "$DEBIAN_BASE" "$DEBIAN_BASE_HASH" debian-base \
    build_debian_base "$DEBIAN_BASE" "$DEBIAN_BASE_HASH"
}
ensure_python_base() {
  base_image_names
  ensure_image "$PYTHON_BASE" "$PYTHON_BASE_HASH" python-base build_python_base "$PYTHON_BASE" "$PYTHON_BASE_HASH"
}

# --- the images inside the node image ----------------------------------------------------

# build_binary_image TAG HASH BINARY DEST [ENTRYPOINT]: FROM scratch plus one static binary.
build_binary_image() {
  local tag=$1 hash=$2 bin=$3 dest=$4 entry=${5:-} ctx
  mkdir -p "$work_dir" # kind-down removes it, the base images stay cached
  ctx=$(mktemp -d "$work_dir/image.XXXXXX")
  cp "$bin" "$ctx/bin"
  {
    echo "FROM scratch"
    echo "COPY bin $dest"
    echo "ENV PATH=/usr/local/bin:/usr/bin:/bin"
    [ -z "$entry" ] || echo "ENTRYPOINT [\"$entry\"]"
  } >"$ctx/Dockerfile"
  docker build -q --label "$recipe_label=$hash" -t "$tag" "$ctx" >/dev/null
  rm -rf "$ctx"
}

# kube-proxy programs iptables: Debian's iptables and conntrack on our Debian base, with
# /usr/sbin on PATH.
build_kube_proxy_image() {
  local tag=$1 hash=$2 bin=$3 ctx
  mkdir -p "$work_dir" # kind-down removes it, the base images stay cached
  ctx=$(mktemp -d "$work_dir/image.XXXXXX")
  cp "$bin" "$ctx/kube-proxy"
  cat >"$ctx/Dockerfile" <<EOF
FROM $DEBIAN_BASE
RUN apt-get update \\
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends iptables conntrack ipset kmod \\
 && apt-get clean && rm -rf /var/lib/apt/lists/* /var/cache/apt/*.bin
COPY kube-proxy /usr/local/bin/kube-proxy
ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
EOF
  docker build --label "$recipe_label=$hash" -t "$tag" "$ctx"
  rm -rf "$ctx"
}

# A shell image with kubectl: busybox (Debian's busybox-static) and our kubectl binary at
# /bin/kubectl (where registry.k8s.io/kubectl has it). Serves as the launcher Dockerfile's
# KUBECTL_IMAGE and as the controller's --kubectl-image (the kubectl-delivery init
# container needs /bin/sh and kubectl on PATH).
build_kubectl_image() {
  local tag=$1 hash=$2 bin=$3 ctx
  mkdir -p "$work_dir" # kind-down removes it, the base images stay cached
  ctx=$(mktemp -d "$work_dir/image.XXXXXX")
  cp "$bin" "$ctx/kubectl"
  cp /bin/busybox "$ctx/busybox"
  cat >"$ctx/Dockerfile" <<'EOF'
FROM scratch
COPY busybox /bin/busybox
RUN ["/bin/busybox", "--install", "-s", "/bin"]
COPY kubectl /bin/kubectl
ENV PATH=/usr/local/bin:/usr/bin:/bin
USER 65532:65532
ENTRYPOINT ["/bin/kubectl"]
EOF
  docker build -q --label "$recipe_label=$hash" -t "$tag" "$ctx" >/dev/null
  rm -rf "$ctx"
}

file_id() { stat -L -c '%n %s %Y' "$@"; }

kubectl_image_name() {
  KUBECTL_IMAGE="mpijob-elastic.local/kubectl:$KUBE_VERSION"
  KUBECTL_IMAGE_HASH=$(recipe_hash "$(declare -f build_kubectl_image)" "$(file_id "$BIN_DIR/kubectl" /bin/busybox)")
}
ensure_kubectl_image() {
  kubectl_image_name
  ensure_image "$KUBECTL_IMAGE" "$KUBECTL_IMAGE_HASH" kubectl-image \
    build_kubectl_image "$KUBECTL_IMAGE" "$KUBECTL_IMAGE_HASH" "$BIN_DIR/kubectl"
}

# The images kubeadm and the kubelet ask for, under the names they ask for, each made from
# our binaries (etcd $ETCD_VERSION stands in for kubeadm's $KIND_ETCD_IMAGE_TAG).
ensure_component_images() {
  local b tag hash
  COMPONENT_IMAGES=()
  for b in kube-apiserver kube-controller-manager kube-scheduler; do
    tag="registry.k8s.io/$b:$KUBE_VERSION"
    hash=$(recipe_hash "$(declare -f build_binary_image)" "$(file_id "$BIN_DIR/$b")")
    ensure_image "$tag" "$hash" "image-$b" build_binary_image "$tag" "$hash" "$BIN_DIR/$b" "/usr/local/bin/$b" || return 1
    COMPONENT_IMAGES+=("$tag")
  done
  tag="registry.k8s.io/kube-proxy:$KUBE_VERSION"
  hash=$(recipe_hash "$DEBIAN_BASE_HASH" "$(declare -f build_kube_proxy_image)" "$(file_id "$BIN_DIR/kube-proxy")")
  ensure_image "$tag" "$hash" image-kube-proxy build_kube_proxy_image "$tag" "$hash" "$BIN_DIR/kube-proxy" || return 1
  COMPONENT_IMAGES+=("$tag")
  tag="registry.k8s.io/etcd:$KIND_ETCD_IMAGE_TAG"
  hash=$(recipe_hash "$(declare -f build_binary_image)" "$(file_id "$BIN_DIR/etcd")")
  ensure_image "$tag" "$hash" image-etcd build_binary_image "$tag" "$hash" "$BIN_DIR/etcd" /usr/local/bin/etcd || return 1
  COMPONENT_IMAGES+=("$tag")
  tag="registry.k8s.io/coredns/coredns:$KIND_COREDNS_VERSION"
  hash=$(recipe_hash "$(declare -f build_binary_image)" "$(file_id "$(coredns_bin)")")
  ensure_image "$tag" "$hash" image-coredns build_binary_image "$tag" "$hash" "$(coredns_bin)" /coredns /coredns || return 1
  COMPONENT_IMAGES+=("$tag")
  tag="registry.k8s.io/pause:$KIND_PAUSE_VERSION"
  hash=$(recipe_hash "$(declare -f build_binary_image)" "$(file_id "$tools_bin/pause")")
  ensure_image "$tag" "$hash" image-pause build_binary_image "$tag" "$hash" "$tools_bin/pause" /pause /pause || return 1
  COMPONENT_IMAGES+=("$tag")
}

# kind's offline node-image build: a Kubernetes "server tarball" assembled from our binaries
# (kubernetes/version, server/bin/{kubeadm,kubelet,kubectl} and image tarballs). kind treats
# every tag found in those tarballs as built and fetches the rest; kube-proxy.tar carries
# etcd, coredns and pause too, so nothing is fetched (the ctr wrapper makes the fetches of
# kindnetd and local-path images, which this cluster does not use, no-ops).
build_node_image() {
  local tag=$1 hash=$2 stage="$work_dir/node-image" b
  rm -rf "$stage" && mkdir -p "$stage/kubernetes/server/bin" "$stage/tmp"
  echo "$KUBE_VERSION" >"$stage/kubernetes/version"
  for b in kubeadm kubelet kubectl; do cp "$BIN_DIR/$b" "$stage/kubernetes/server/bin/$b"; done
  for b in kube-apiserver kube-controller-manager kube-scheduler; do
    docker save "registry.k8s.io/$b:$KUBE_VERSION" >"$stage/kubernetes/server/bin/$b.tar"
  done
  docker save "registry.k8s.io/kube-proxy:$KUBE_VERSION" "registry.k8s.io/etcd:$KIND_ETCD_IMAGE_TAG" \
    "registry.k8s.io/coredns/coredns:$KIND_COREDNS_VERSION" "registry.k8s.io/pause:$KIND_PAUSE_VERSION" \
    >"$stage/kubernetes/server/bin/kube-proxy.tar"
  tar -C "$stage" -c kubernetes | gzip -1 >"$stage/kubernetes-server-linux-amd64.tar.gz"
  rm -rf "$stage/kubernetes"
  TMPDIR="$stage/tmp" kind build node-image --type file --base-image "$NODE_BASE" \
    --image "$tag.unlabelled" "$stage/kubernetes-server-linux-amd64.tar.gz"
  # kind commits the image itself; one more layer replaces kind's default storage (whose
  # provisioner image cannot be pulled here) and adds the recipe label.
  mkdir -p "$stage/final"
  cp "$kind_hack/kind/node-base/default-storage.yaml" "$stage/final/"
  printf 'FROM %s\nCOPY default-storage.yaml /kind/manifests/default-storage.yaml\nLABEL %s=%s\n' \
    "$tag.unlabelled" "$recipe_label" "$hash" >"$stage/final/Dockerfile"
  docker build -q -t "$tag" "$stage/final" >/dev/null
  docker rmi "$tag.unlabelled" >/dev/null
  rm -rf "$stage"
}

node_image_name() {
  NODE_IMAGE="mpijob-elastic.local/kind-node:$KUBE_VERSION"
}

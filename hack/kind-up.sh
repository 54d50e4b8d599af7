#!/usr/bin/env bash
# Starts a kind cluster for the project, from a clean machine, and prints the path of its
# kubeconfig on stdout (progress on stderr). Idempotent: with the cluster up it only prints
# the kubeconfig path. Everything it builds is cached under
# ${MPIJOB_ELASTIC_CACHE:-~/.cache/mpijob-elastic}/kind, keyed by the versions in
# hack/versions.env; hack/kind-down.sh stops it all and keeps the caches. See docs/kind.md.
#
#   KIND_NODE_IMAGE=local     (default) build the node image from our own Kubernetes
#                             binaries; no registry needed
#   KIND_NODE_IMAGE=official  kindest/node:$KUBE_VERSION from Docker Hub
#   KIND_NODE_IMAGE=<image>   any node image the Docker engine has or can pull
#   KIND_DOCKER=auto|private|system   which Docker engine (see hack/kind/lib.sh)
#   KIND_CLUSTER=mpijob-elastic       the cluster's name
set -euo pipefail
log_name=kind-up
# shellcheck source=kind/lib.sh
. "$(dirname "$0")/kind/lib.sh"
# shellcheck source=kind/local-images.sh
. "$kind_hack/kind/local-images.sh"

node_mode=${KIND_NODE_IMAGE:-local}
kind_subnet=${KIND_SUBNET:-172.29.0.0/24}
pod_subnet=10.244.0.0/16
total=$SECONDS

pkg_installed() { dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep 'install ok installed' >/dev/null; }

# Debian packages: the Docker engine (private mode only), debootstrap and busybox-static
# (local images only).
ensure_packages() {
  local want=() missing=() p
  [ "$docker_mode" = private ] && want+=(docker.io iptables)
  [ "$node_mode" = local ] && want+=(debootstrap busybox-static)
  for p in "${want[@]}"; do pkg_installed "$p" || missing+=("$p"); done
  [ ${#missing[@]} -eq 0 ] && return 0
  [ "$(id -u)" = 0 ] || die "needs the Debian packages ${missing[*]}; install them (as root) and rerun"
  command -v apt-get >/dev/null || die "needs ${missing[*]} (Debian packages); install the equivalent and rerun"
  timed "apt-get-install" bash -c "apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends ${missing[*]}" ||
    die "apt-get install ${missing[*]}"
}

# Sysctls a kubelet (here: the kind node's) changes for the whole machine, and the host
# paths Docker or kind create; kind-down.sh puts them back.
host_sysctls="kernel.panic kernel.panic_on_oops vm.overcommit_memory vm.panic_on_oom
  kernel.keys.root_maxkeys kernel.keys.root_maxbytes net.ipv4.ip_forward
  net.ipv4.conf.all.forwarding net.ipv6.conf.all.forwarding"
record_host_state() {
  local f="$kind_cache/host-state" s
  [ -e "$f" ] && return 0
  {
    for s in $host_sysctls; do
      v=$(sysctl -n "$s" 2>/dev/null) && echo "sysctl $s=$v"
    done
    # dockerd turns the FORWARD policy to DROP when it enables forwarding.
    iptables -S FORWARD 2>/dev/null | awk '$1 == "-P" {print "policy iptables " $3}'
    ip6tables -S FORWARD 2>/dev/null | awk '$1 == "-P" {print "policy ip6tables " $3}'
    # Empty directories kind (/lib/modules, a volume source) and our dockerd and its
    # containerd shims create outside our paths.
    for d in /lib/modules /run/docker /run/containerd; do [ -e "$d" ] || echo "created $d"; done
    # dockerd's parent cgroup (cgroupfs driver), one per controller on cgroup v1.
    compgen -G '/sys/fs/cgroup/*/docker' >/dev/null || [ -d /sys/fs/cgroup/docker ] || echo "created-cgroup docker"
    ip link show docker0 >/dev/null 2>&1 || echo "created-link docker0"
  } >"$f.tmp"
  mv "$f.tmp" "$f"
}

# Debian's dockerd on private paths, with runc-nocap as the default runtime; reused when
# it already runs.
start_dockerd() {
  local pid i stale
  if pid=$(dockerd_pid); then
    log "reusing our dockerd (pid $pid, $DOCKER_HOST)"
    return 0
  fi
  mkdir -p "$run_dir" "$docker_root" "$docker_exec_root"
  rm -f "$docker_sock" "$docker_pidfile"
  record_host_state
  echo '{}' >"$run_dir/daemon.json"
  log "starting dockerd (data-root $docker_root, socket $docker_sock)"
  setsid nohup dockerd \
    --config-file "$run_dir/daemon.json" \
    --data-root "$docker_root" \
    --exec-root "$docker_exec_root" \
    --pidfile "$docker_pidfile" \
    -H "unix://$docker_sock" \
    --add-runtime "runc-nocap=$tools_bin/runc-nocap" \
    --default-runtime runc-nocap \
    --mtu "$(host_mtu)" \
    --log-level warn \
    >"$run_dir/dockerd.log" 2>&1 </dev/null 8>&- &
  for i in $(seq 1 60); do
    if docker info >/dev/null 2>&1; then
      log "dockerd up in ${i}s"
      # `down` leaves no container; any here are from an engine that was killed (and may
      # have been restarted by their restart policy just now).
      stale=$(docker ps -aq)
      [ -z "$stale" ] || { log "removing containers left by an unclean stop"; docker rm -f -v $stale >/dev/null; }
      return 0
    fi
    dockerd_pid >/dev/null || [ "$i" -lt 5 ] || { tail -n 20 "$run_dir/dockerd.log" >&2; die "dockerd exited"; }
    sleep 1
  done
  tail -n 20 "$run_dir/dockerd.log" >&2
  die "dockerd did not answer within 60s"
}

node_container() { echo "$cluster_name-control-plane"; }
# Two nodes, both taking pods: a node can be drained while the job keeps its size on the
# other (the e2e walk's kubectl drain). kind names them after their roles.
node_containers=("$cluster_name-control-plane" "$cluster_name-worker")

cluster_exists() { kind get clusters 2>/dev/null | grep -x "$cluster_name" >/dev/null; }

write_kubeconfig() {
  kind get kubeconfig --name "$cluster_name" >"$kubeconfig_path.tmp" && mv "$kubeconfig_path.tmp" "$kubeconfig_path"
}

k() { kubectl --kubeconfig "$kubeconfig_path" "$@"; }

# Our kubectl (the pinned version) for waiting; the one on PATH may be anything.
ensure_kubectl() {
  if [ -z "${BIN_DIR:-}" ]; then
    BIN_DIR=$(PATH="/usr/local/go/bin:$PATH" "$kind_hack/build-binaries.sh")
    export BIN_DIR
  fi
  export PATH="$BIN_DIR:$PATH"
}

cluster_healthy() {
  local node
  for node in "${node_containers[@]}"; do
    [ "$(docker inspect -f '{{.State.Running}}' "$node" 2>/dev/null)" = true ] || return 1
  done
  write_kubeconfig || return 1
  k get --raw /readyz >/dev/null 2>&1 || return 1
  # A cluster made before it had a worker node has one node: made again.
  [ "$(k get nodes -o name 2>/dev/null | wc -l)" = "${#node_containers[@]}" ]
}

# debootstrap once, then the Python base and the node base on top of it, side by side.
build_bases() {
  local pp
  if [ "$(image_recipe "$DEBIAN_BASE")" != "$DEBIAN_BASE_HASH" ] && [ "$(id -u)" != 0 ]; then
    log "debootstrap needs root: run as root, or use KIND_NODE_IMAGE=official (docs/kind.md)"
    return 1
  fi
  ensure_debian_base || return 1
  ensure_python_base &
  pp=$!
  ensure_image "$NODE_BASE" "$NODE_BASE_HASH" node-base build_node_base "$NODE_BASE" "$NODE_BASE_HASH" ||
    { wait $pp; return 1; }
  wait $pp
}

# The local node image and everything in it; each step is skipped when cached.
build_local_node_image() {
  local bg=() names=() i rc=0
  BIN_DIR=$(PATH="/usr/local/go/bin:$PATH" "$kind_hack/build-binaries.sh")
  export BIN_DIR
  base_image_names
  node_image_name
  # Long independent steps overlap: Go builds use the CPU, debootstrap and apt the network.
  if [ ! -x "$BIN_DIR/kubelet" ] || [ ! -x "$BIN_DIR/kubeadm" ] || [ ! -x "$BIN_DIR/kube-proxy" ]; then
    log "node binaries (kubelet, kubeadm, kube-proxy) ... (log: $logs_dir/node-binaries.log)"
    (PATH="/usr/local/go/bin:$PATH" "$kind_hack/build-binaries.sh" --node >/dev/null 2>"$logs_dir/node-binaries.log") &
    bg+=($!) names+=(node-binaries)
  fi
  if [ ! -x "$(coredns_bin)" ]; then
    (ensure_coredns) &
    bg+=($!) names+=(coredns)
  fi
  (build_bases) &
  bg+=($!) names+=(base-images)
  for i in "${!bg[@]}"; do
    wait "${bg[$i]}" || { log "${names[$i]} failed"; rc=1; }
  done
  [ $rc = 0 ] || { [ ! -s "$logs_dir/node-binaries.log" ] || tail -n 5 "$logs_dir/node-binaries.log" >&2; die "building the node image's parts"; }
  ensure_component_images || die "component images"
  ensure_kubectl_image || die "kubectl image"
  NODE_IMAGE_HASH=$(recipe_hash "$NODE_BASE_HASH" "$KIND_VERSION" "$(declare -f build_node_image)" \
    "$kind_hack/kind/node-base/default-storage.yaml" \
    "$(for i in "${COMPONENT_IMAGES[@]}"; do image_recipe "$i"; done)" \
    "$(file_id "$BIN_DIR/kubeadm" "$BIN_DIR/kubelet" "$BIN_DIR/kubectl")")
  ensure_image "$NODE_IMAGE" "$NODE_IMAGE_HASH" node-image build_node_image "$NODE_IMAGE" "$NODE_IMAGE_HASH" ||
    die "kind build node-image"
  docker image prune -f >/dev/null 2>&1 || true  # replaced builds leave untagged images
}

# Pod networking without kindnetd (an image we cannot pull): the ptp plugin with host-local
# addresses, mounted into each node: node i gets 10.244.i.0/24, and route_pod_ranges tells
# every node where the others' ranges are.
cni_config() { echo "$run_dir/cni/10-ptp-$1.conflist"; }
write_cni_config() {
  local i f
  mkdir -p "$run_dir/cni"
  for i in "${!node_containers[@]}"; do
    f=$(cni_config "$i")
    # Docker makes a missing bind-mount source a directory (a node restarted without it).
    [ ! -d "$f" ] || rm -rf "$f"
    write_ptp_conflist "${pod_subnet%.0.0/16}.$i.0/24" >"$f"
  done
}
write_ptp_conflist() {
  cat <<EOF
{
  "cniVersion": "0.4.0",
  "name": "kind-ptp",
  "plugins": [
    {
      "type": "ptp",
      "ipMasq": true,
      "mtu": $(host_mtu),
      "ipam": {
        "type": "host-local",
        "ranges": [[{"subnet": "$1"}]],
        "routes": [{"dst": "0.0.0.0/0"}]
      }
    },
    {"type": "portmap", "capabilities": {"portMappings": true}}
  ]
}
EOF
}

write_kind_config() {
  local f="$run_dir/kind-config-$cluster_name.yaml" i
  {
    echo "kind: Cluster"
    echo "apiVersion: kind.x-k8s.io/v1alpha4"
    echo "networking:"
    echo "  apiServerAddress: 127.0.0.1"
    echo "  podSubnet: $pod_subnet"
    [ "$node_mode" != local ] || echo "  disableDefaultCNI: true"
    echo "nodes:"
    for i in "${!node_containers[@]}"; do
      if [ "$i" = 0 ]; then echo "  - role: control-plane"; else echo "  - role: worker"; fi
      if [ "$node_mode" = local ]; then
        echo "    extraMounts:"
        echo "      - hostPath: $(cni_config "$i")"
        echo "        containerPath: /etc/cni/net.d/10-ptp.conflist"
        echo "        readOnly: true"
      fi
    done
  } >"$f"
  echo "$f"
}

ensure_network() {
  local id
  docker network inspect kind >/dev/null 2>&1 && return 0
  [ "$docker_mode" = private ] || return 0 # kind creates it on a system engine
  docker network create -d bridge --subnet "$kind_subnet" \
    -o com.docker.network.bridge.enable_ip_masquerade=true \
    -o com.docker.network.driver.mtu="$(host_mtu)" kind >/dev/null
  id=$(docker network inspect -f '{{.Id}}' kind)
  echo "created-link br-${id:0:12}" >>"$kind_cache/host-state"
  log "docker network kind ($kind_subnet, bridge br-${id:0:12})"
}

# Each node's pod range through that node's address on the kind network (the ptp plugin
# only routes a node's own pods).
route_pod_ranges() {
  local i j ip
  for i in "${!node_containers[@]}"; do
    ip=$(docker inspect -f '{{(index .NetworkSettings.Networks "kind").IPAddress}}' "${node_containers[$i]}") ||
      die "no address of ${node_containers[$i]} on the kind network"
    for j in "${!node_containers[@]}"; do
      [ "$i" = "$j" ] || docker exec "${node_containers[$j]}" ip route replace "${pod_subnet%.0.0/16}.$i.0/24" via "$ip" ||
        die "route to the pods of ${node_containers[$i]}"
    done
  done
}

wait_ready() {
  local start=$SECONDS
  until k get serviceaccount default -n default >/dev/null 2>&1; do
    [ $((SECONDS - start)) -lt 120 ] || die "no default ServiceAccount after 120s"
    sleep 1
  done
  k wait --for=condition=Ready nodes --all --timeout=120s >/dev/null ||
    die "nodes not Ready (kubectl get nodes)"
  k -n kube-system rollout status daemonset/kube-proxy --timeout=120s >/dev/null ||
    die "kube-proxy not ready (kubectl -n kube-system get pods)"
  k -n kube-system rollout status deployment/coredns --timeout=120s >/dev/null ||
    die "coredns not ready (kubectl -n kube-system get pods)"
  log "nodes Ready, default ServiceAccount, kube-proxy and coredns up in $((SECONDS - start))s"
}

# One kind-up or kind-down at a time (they share the engine, the network and the caches).
exec 8>"$kind_cache/.lock"
if ! flock -n 8; then
  log "waiting for another kind-up/kind-down to finish"
  flock 8
fi

docker_mode=$(docker_mode)
case $node_mode in
  local) ;;
  official) NODE_IMAGE="kindest/node:$KUBE_VERSION" ;;
  *) NODE_IMAGE=$node_mode ;;
esac
ensure_packages
use_docker
ensure_tools
[ "$docker_mode" = private ] && start_dockerd
docker info >/dev/null 2>&1 || die "the Docker engine does not answer (KIND_DOCKER=$docker_mode, DOCKER_HOST=${DOCKER_HOST:-unset})"
mkdir -p "$run_dir"
ensure_kubectl

if cluster_exists; then
  if cluster_healthy; then
    log "cluster $cluster_name is up"
    echo "$kubeconfig_path"
    exit 0
  fi
  log "cluster $cluster_name exists but does not answer or has another number of nodes: recreating it"
  kind delete cluster --name "$cluster_name" --kubeconfig "$kubeconfig_path" >&2
fi

[ "$node_mode" = local ] && build_local_node_image
write_cni_config
config=$(write_kind_config)
ensure_network
start=$SECONDS
log "creating cluster $cluster_name from $NODE_IMAGE ... (log: $logs_dir/kind-create-$cluster_name.log)"
if ! kind create cluster --name "$cluster_name" --image "$NODE_IMAGE" --config "$config" \
  --kubeconfig "$kubeconfig_path" --wait 120s >"$logs_dir/kind-create-$cluster_name.log" 2>&1; then
  tail -n 30 "$logs_dir/kind-create-$cluster_name.log" >&2
  die "kind create cluster (hack/kind-down.sh cleans up)"
fi
log "kind create cluster done in $((SECONDS - start))s"
[ "$node_mode" != local ] || route_pod_ranges
# kind keeps the control plane's NoSchedule taint once there is a worker node; with it,
# every pod would go to the worker and a drain there could not keep a job's size.
cp_taints=$(k get node "$(node_container)" -o jsonpath='{.spec.taints[*].key}') || die "reading the control-plane node"
if [[ " $cp_taints " == *" node-role.kubernetes.io/control-plane "* ]]; then
  k taint nodes "$(node_container)" node-role.kubernetes.io/control-plane:NoSchedule- >/dev/null ||
    die "untainting the control-plane node"
fi
wait_ready
log "cluster $cluster_name up in $((SECONDS - total))s; kubeconfig $kubeconfig_path"
echo "$kubeconfig_path"

# Shared by hack/kind-up.sh, hack/kind-down.sh and hack/images.sh (sourced, not run).
# Paths, logging, and the Docker engine the kind cluster lives in. See docs/kind.md.
# shellcheck shell=bash

kind_hack=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
repo_root=$(cd "$kind_hack/.." && pwd)
# shellcheck source=../versions.env
. "$kind_hack/versions.env"

cache_root=${MPIJOB_ELASTIC_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/mpijob-elastic}
kind_cache="$cache_root/kind"
# Docker's data-root: built images survive `down` here, so the next `up` is fast.
docker_root="$kind_cache/docker"
# Our dockerd's socket, pidfile, exec-root, logs, the kubeconfig: what lives while `up`.
run_dir="$kind_cache/run"
# kind itself and the small static helper programs, keyed by version.
tools_bin="$kind_cache/bin/kind-$KIND_VERSION"
# Scratch space for image builds (rootfs trees, tarballs); emptied after each build.
work_dir="$kind_cache/work"
logs_dir="$kind_cache/logs"
cluster_name=${KIND_CLUSTER:-mpijob-elastic}
kubeconfig_path="$run_dir/kubeconfig-$cluster_name"
docker_sock="$run_dir/docker.sock"
docker_pidfile="$run_dir/dockerd.pid"
docker_exec_root="$run_dir/exec"
mkdir -p "$kind_cache" "$logs_dir"

: "${log_name:=kind}"
log() { printf '[%s %s] %s\n' "$log_name" "$(date +%H:%M:%S)" "$*" >&2; }
die() { log "FAILED: $*"; exit 1; }

# timed NAME CMD...: runs a long step with its output in $logs_dir/NAME.log, printing the
# elapsed time, and the log's tail on failure. CMD may be a function of local-images.sh;
# variables it needs beyond those must be exported.
timed() {
  local name=$1; shift
  local start=$SECONDS logf="$logs_dir/$name.log"
  log "$name ... (log: $logf)"
  # In a fresh shell (step.sh), so that `set -e` holds inside shell functions.
  if ! "$kind_hack/kind/step.sh" "$@" >"$logf" 2>&1; then
    tail -n 30 "$logf" >&2
    log "$name failed after $((SECONDS - start))s"
    return 1
  fi
  log "$name done in $((SECONDS - start))s"
}

# A short content hash of files and strings, for image tags that change with their recipe.
recipe_hash() {
  local f
  for f in "$@"; do
    if [ -f "$f" ]; then cat "$f"; else printf '%s\n' "$f"; fi
  done | sha256sum | cut -c1-10
}

# Which Docker engine: KIND_DOCKER=private starts Debian's dockerd on private paths under
# $run_dir (machines without a Docker engine of their own: no systemd, no registry);
# KIND_DOCKER=system uses whatever the docker CLI reaches (DOCKER_HOST or the system
# socket). The default, auto, picks system when DOCKER_HOST is set or /var/run/docker.sock
# answers, private otherwise.
docker_mode() {
  local mode=${KIND_DOCKER:-auto}
  if [ "$mode" = auto ]; then
    if [ -n "${DOCKER_HOST:-}" ] && [ "${DOCKER_HOST}" != "unix://$docker_sock" ]; then
      mode=system
    elif [ -S /var/run/docker.sock ] && docker -H unix:///var/run/docker.sock info >/dev/null 2>&1; then
      mode=system
    else
      mode=private
    fi
  fi
  case $mode in private | system) echo "$mode" ;; *) die "KIND_DOCKER=$mode: use auto, private or system" ;; esac
}

# Points this shell (and kind, which runs `docker`) at the engine. The images need
# BuildKit (COPY --chmod): in private mode the docker CLI is Debian's 20.10 one
# (/usr/bin/docker, BuildKit built in, DOCKER_BUILDKIT=1), put first on PATH through
# $tools_bin/shims, since a newer CLI elsewhere on PATH may lack the buildx plugin it
# needs for BuildKit. In system mode the CLI on PATH is used when it has buildx.
use_docker() {
  mode=$(docker_mode)
  local shim=0
  if [ "$mode" = private ]; then
    export DOCKER_HOST="unix://$docker_sock"
    shim=1
  elif ! docker buildx version >/dev/null 2>&1 && [ -x /usr/bin/docker ] &&
    ! /usr/bin/docker buildx version >/dev/null 2>&1; then
    shim=1 # Debian's CLI: BuildKit without buildx
  fi
  if [ $shim = 1 ]; then
    mkdir -p "$tools_bin/shims"
    ln -sf /usr/bin/docker "$tools_bin/shims/docker"
    export PATH="$tools_bin/shims:$tools_bin:$PATH"
  else
    export PATH="$tools_bin:$PATH"
  fi
  export DOCKER_BUILDKIT=1
}

dockerd_pid() {
  local pid
  [ -s "$docker_pidfile" ] || return 1
  pid=$(cat "$docker_pidfile")
  [ -d "/proc/$pid" ] && grep -q dockerd "/proc/$pid/cmdline" 2>/dev/null && echo "$pid"
}

# The MTU of the interface the default route uses: bridges and pod interfaces must not
# exceed it (1400 on our VMs), or large packets through the egress proxy stall.
host_mtu() {
  local dev
  dev=$(ip route show default 2>/dev/null | awk '{for (i = 1; i < NF; i++) if ($i == "dev") {print $(i + 1); exit}}')
  cat "/sys/class/net/${dev:-eth0}/mtu" 2>/dev/null || echo 1500
}

# write_install_overlay DIR: the README's install steps, on a copy of config/ in DIR: the
# controller image set in config/default's `images:` entry (newName, newTag) to
# MPIJOB_ELASTIC_IMAGE as hack/images.sh prints it. DIR's kustomization.yaml is
# config/default plus, only when E2E_KUBECTL_IMAGE is set (no registry for the default
# kubectl image), the --kubectl-image argument the kubectl-delivery init container copies
# from. `kubectl apply -k DIR` installs, `kubectl delete -k DIR` uninstalls.
write_install_overlay() {
  local dir=$1 default
  cp -r "$repo_root/config" "$dir/config"
  default="$dir/config/default/kustomization.yaml"
  sed -i -E "s|^(    newName:).*|\1 ${MPIJOB_ELASTIC_IMAGE%:*}|; s|^(    newTag:).*|\1 ${MPIJOB_ELASTIC_IMAGE##*:}|" "$default"
  grep -qxF "    newTag: ${MPIJOB_ELASTIC_IMAGE##*:}" "$default" || die "no images: entry in $default"
  {
    echo "apiVersion: kustomize.config.k8s.io/v1beta1"
    echo "kind: Kustomization"
    echo "resources:"
    echo "  - config/default"
    if [ -n "${E2E_KUBECTL_IMAGE:-}" ]; then
      echo "patches:"
      echo "  - target: {kind: Deployment, name: mpijob-elastic}"
      echo "    patch: |"
      echo "      - op: add"
      echo "        path: /spec/template/spec/containers/0/args/-"
      echo "        value: --kubectl-image=$E2E_KUBECTL_IMAGE"
    fi
  } >"$dir/kustomization.yaml"
}

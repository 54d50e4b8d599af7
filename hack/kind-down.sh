#!/usr/bin/env bash
# Deletes the kind cluster hack/kind-up.sh started and, when kind-up.sh started its own
# dockerd, stops it (and the containerd it runs) and removes what they leave on the host:
# processes, containers, docker networks, iptables rules and chains, bridges, mounts, and
# the sysctls the node's kubelet changed. Keeps the caches: the images stay in Docker's
# data-root for the next `up`. Safe to run when nothing is up. See docs/kind.md.
set -euo pipefail
log_name=kind-down
# shellcheck source=kind/lib.sh
. "$(dirname "$0")/kind/lib.sh"

exec 8>"$kind_cache/.lock"
if ! flock -n 8; then
  log "waiting for another kind-up/kind-down to finish"
  flock 8
fi

# private: our dockerd runs (it stops, with every cluster in it); system: only the cluster
# is deleted; none: nothing of ours runs, only the host clean-up below (after a crash).
case ${KIND_DOCKER:-auto} in
  system) mode=system ;;
  private) if pid=$(dockerd_pid); then mode=private; else mode=none; fi ;;
  *)
    if pid=$(dockerd_pid); then
      mode=private
    elif [ -z "${DOCKER_HOST:-}" ] && [ ! -S /var/run/docker.sock ]; then
      mode=none
    else
      mode=$(docker_mode)
      [ "$mode" = private ] && mode=none
    fi ;;
esac
[ "$mode" = none ] || use_docker
export PATH="$tools_bin:$PATH"

if [ "$mode" != none ] && command -v kind >/dev/null && kind get clusters 2>/dev/null | grep -x "$cluster_name" >/dev/null; then
  log "deleting cluster $cluster_name"
  kind delete cluster --name "$cluster_name" --kubeconfig "$kubeconfig_path" >&2
fi
rm -f "$kubeconfig_path" "$kubeconfig_path.tmp"

if [ "$mode" != private ]; then
  [ "$mode" = none ] || log "the Docker engine is not ours ($mode): left running"
else
  # Our engine: nothing in it outlives `down` (containers and networks hold iptables rules,
  # bridges and mounts); images stay.
  ids=$(docker ps -aq)
  [ -z "$ids" ] || { log "removing containers"; docker rm -f -v $ids >/dev/null; }
  for net in $(docker network ls --format '{{.Name}}'); do
    case $net in bridge | host | none) ;; *) { docker network rm "$net" >/dev/null && log "removed docker network $net"; } || true ;; esac
  done
  log "stopping dockerd (pid $pid)"
  kill -TERM "$pid"
  for _ in $(seq 1 30); do [ -d "/proc/$pid" ] || break; sleep 1; done
  if [ -d "/proc/$pid" ]; then
    log "dockerd still running after 30s: killing it"
    kill -KILL "$pid" || true
  fi
fi

# What may be left of a private engine, even after a crash: processes started from our
# paths (containerd, shims, docker-proxy), mounts under our paths.
ours() {
  local f pid
  for f in /proc/[0-9]*/cmdline; do
    pid=${f#/proc/}; pid=${pid%/cmdline}
    case $(cat "/proc/$pid/comm" 2>/dev/null) in
      dockerd | containerd | containerd-shim* | docker-proxy | runc*) ;;
      *) continue ;;
    esac
    tr '\0' ' ' <"$f" 2>/dev/null | grep -F -e "$run_dir" -e "$docker_root" >/dev/null && echo "$pid"
  done
  return 0
}
# Processes of our engine's containers that outlived it (a killed dockerd or shim leaves
# them running): they sit in the cgroup /docker/<id> of a container of our data-root.
container_ids() { ls "$docker_root/containers" 2>/dev/null || true; }
in_our_containers() {
  local ids f
  ids=$(container_ids | paste -sd'|')
  [ -n "$ids" ] || return 0
  grep -lE "/docker/($ids)(/|\$)" /proc/[0-9]*/cgroup 2>/dev/null | cut -d/ -f3 || true
}
if [ "$mode" != system ]; then
  pids=$(in_our_containers)
  if [ -n "$pids" ]; then
    log "killing processes left in our containers: $(echo $pids | wc -w)"
    kill -KILL $pids 2>/dev/null || true
    sleep 1
  fi
fi
for sig in TERM KILL; do
  [ "$mode" != system ] || break # a private dockerd may serve the system-mode cluster
  pids=$(ours)
  [ -n "$pids" ] || break
  log "stopping leftover processes ($sig): $(echo $pids)"
  kill "-$sig" $pids 2>/dev/null || true
  sleep 2
done
# Their empty cgroups.
if [ "$mode" != system ]; then
  for id in $(container_ids); do
    for d in /sys/fs/cgroup/*/docker/"$id" /sys/fs/cgroup/docker/"$id"; do
      [ ! -d "$d" ] || find "$d" -depth -type d -exec rmdir {} + 2>/dev/null || true
    done
  done
fi
[ "$mode" = system ] || for m in $(awk -v a="$run_dir" -v b="$docker_root" -v c="$work_dir" \
  'index($2, a) == 1 || index($2, b) == 1 || index($2, c) == 1 {print $2}' /proc/self/mounts | sort -r); do
  umount "$m" 2>/dev/null || umount -l "$m" || true
done

# Docker's iptables rules and chains (dockerd leaves them when it stops), in every table
# for IPv4 and IPv6. Only when the engine was ours: a system engine keeps its own.
clean_iptables() {
  local cmd=$1 links=$2 t line chains c rules
  command -v "$cmd" >/dev/null || return 0
  for t in filter nat mangle raw; do
    "$cmd" -t "$t" -S >/dev/null 2>&1 || continue
    rules=$("$cmd" -t "$t" -S 2>/dev/null | grep -E '^-A ' | grep -vE '^-A DOCKER' |
      grep -E -- "-[jg] DOCKER|[io] ($links)( |\$)" || true)
    while read -r line; do
      [ -z "$line" ] || eval "$cmd -t $t -D ${line#-A }" 2>/dev/null || true
    done <<<"$rules"
    chains=$("$cmd" -t "$t" -S 2>/dev/null | awk '$1 == "-N" && $2 ~ /^DOCKER/ {print $2}')
    for c in $chains; do "$cmd" -t "$t" -F "$c" 2>/dev/null || true; done
    for c in $chains; do "$cmd" -t "$t" -X "$c" 2>/dev/null || true; done
  done
}

state="$kind_cache/host-state"
if [ -e "$state" ] && [ "$mode" != system ]; then
  if [ "$mode" = private ] || [ -e "$docker_sock" ] || [ -d "$run_dir" ]; then
    # The bridges our engine made (docker0 if it was not there before, the kind network's).
    links=$(sed -n 's/^created-link //p' "$state" | paste -sd'|')
    clean_iptables iptables "${links:-docker0}"
    clean_iptables ip6tables "${links:-docker0}"
    sed -n 's/^policy //p' "$state" | while read -r cmd policy; do
      "$cmd" -P FORWARD "$policy" 2>/dev/null || true
    done
  fi
  for link in $(sed -n 's/^created-link //p' "$state"); do
    if ip link show "$link" >/dev/null 2>&1; then
      { ip link delete "$link" && log "removed bridge $link"; } || true
    fi
  done
  # Sysctls back to what they were before the first `up`.
  sed -n 's/^sysctl //p' "$state" | while IFS= read -r kv; do
    [ "$(sysctl -n "${kv%%=*}" 2>/dev/null)" = "${kv#*=}" ] || sysctl -q -w "$kv" >/dev/null 2>&1 || true
  done
  for d in $(sed -n 's/^created //p' "$state"); do
    # Only directories, and only while they hold nothing but empty directories.
    if [ -d "$d" ] && [ -z "$(find "$d" ! -type d -print -quit 2>/dev/null)" ]; then
      { find "$d" -depth -type d -empty -delete 2>/dev/null && log "removed $d"; } || true
    fi
  done
  if grep -qx 'created-cgroup docker' "$state"; then
    for d in /sys/fs/cgroup/*/docker /sys/fs/cgroup/docker; do
      # rmdir fails, harmlessly, on a cgroup that still has processes
      [ ! -d "$d" ] || find "$d" -depth -type d -exec rmdir {} + 2>/dev/null || true
    done
  fi
  rm -f "$state"
fi

if [ "$mode" = system ]; then
  rm -f "$run_dir/kind-config-$cluster_name.yaml"
else
  rm -rf "$run_dir" "$work_dir" # work/: what an interrupted build left
fi
log "down; caches kept in $kind_cache ($(du -sh "$kind_cache" 2>/dev/null | cut -f1))"

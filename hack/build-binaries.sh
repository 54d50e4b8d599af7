#!/usr/bin/env bash
# Builds the Kubernetes binaries the local cluster needs from Go modules into a versioned
# cache outside the repo, and prints the directory that holds them.
#
# Lookup order for each binary: an explicit env var (KUBE_APISERVER_BINARY, ETCD_BINARY,
# ...), then the cache, then a build. Binaries on PATH are deliberately not used for the
# control plane: a stray kube-apiserver of another minor would make test results depend on
# the machine. Progress goes to stderr; stdout is only the bin directory.
#
# `--node` (or KUBE_NODE_BINARIES=1) also builds kubelet, kubeadm and kube-proxy, the same
# way: only the kind node image needs them (hack/kind-up.sh), the KWOK cluster does not.
set -euo pipefail
node_binaries=${KUBE_NODE_BINARIES:-0}
for arg in "$@"; do
  case $arg in
    --node) node_binaries=1 ;;
    *) echo "usage: $0 [--node]" >&2; exit 2 ;;
  esac
done
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=versions.env
. "$here/versions.env"

cache_root=${MPIJOB_ELASTIC_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/mpijob-elastic}
bin_dir="$cache_root/bin/kube-$KUBE_VERSION-etcd-$ETCD_VERSION-kwok-$KWOK_VERSION"
src_dir="$cache_root/src"
mkdir -p "$bin_dir" "$src_dir"

log() { printf '[build-binaries %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }

# Test sessions, the demo and kind-up may all ask at once; one builds, the others wait for
# it and then find the binaries cached.
exec 9>"$cache_root/.build.lock"
if ! flock -n 9; then
  log "waiting for another build-binaries run to finish"
  flock 9
fi

fail() {
  log "FAILED: $1"
  log "Provide the binary by hand instead: build or download $2 and point $3 at it," \
    "or put it at $bin_dir/$2."
  exit 1
}

# Runs a build step, printing elapsed time; the whole go build output goes to a log file
# so a failure can be read without drowning the terminal.
timed() {
  local name=$1; shift
  local start=$SECONDS logf="$src_dir/$name.log"
  log "building $name (first time only; the log is $logf)"
  if ! "$@" >"$logf" 2>&1; then
    tail -n 30 "$logf" >&2
    return 1
  fi
  log "built $name in $((SECONDS - start))s"
}

minor=${KUBE_VERSION#v1.}; minor=${minor%%.*}
etcd_minor=${ETCD_VERSION#v}; etcd_minor=0.${etcd_minor#3.}  # staging modules are v0.Y.Z

build_kube() {
  local dir="$src_dir/kubernetes-$KUBE_VERSION" gomod
  mkdir -p "$dir"
  gomod=$(go mod download -json "k8s.io/kubernetes@$KUBE_VERSION" |
    python3 -c 'import json,sys; print(json.load(sys.stdin)["GoMod"])')
  {
    echo "module mpijob-elastic/kube-binaries"
    echo
    echo "go 1.24"
    echo
    echo "require k8s.io/kubernetes $KUBE_VERSION"
    echo
    # k8s.io/kubernetes points its staging modules at ./staging; a module that depends on
    # it must point them at the published v0.Y.Z tags instead.
    sed -n 's#^[[:space:]]*\(k8s.io/[^[:space:]]*\) => ./staging/.*#replace \1 => \1 v0.'"${KUBE_VERSION#v1.}"'#p' "$gomod"
  } >"$dir/go.mod"
  cat >"$dir/tools.go" <<'GO'
//go:build tools

package tools

import (
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kube-controller-manager"
	_ "k8s.io/kubernetes/cmd/kube-scheduler"
	_ "k8s.io/kubernetes/cmd/kubectl"
)
GO
  (cd "$dir" && go mod tidy)
}

# The node binaries join the same module in a file of their own, so the KWOK path never
# resolves their dependencies.
add_node_tools() {
  local dir="$src_dir/kubernetes-$KUBE_VERSION"
  [ -f "$dir/go.mod" ] || build_kube
  cat >"$dir/tools_node.go" <<'GO'
//go:build tools

package tools

import (
	_ "k8s.io/kubernetes/cmd/kubeadm"
	_ "k8s.io/kubernetes/cmd/kube-proxy"
	_ "k8s.io/kubernetes/cmd/kubelet"
)
GO
  (cd "$dir" && go mod tidy)
}

kube_ldflags() {
  local f="" pkg
  for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    f+=" -X $pkg.gitVersion=$KUBE_VERSION -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor"
    f+=" -X $pkg.gitTreeState=clean -X $pkg.buildDate=1970-01-01T00:00:00Z"
  done
  echo "-s -w$f"
}

build_etcd() {
  local dir="$src_dir/etcd-$ETCD_VERSION"
  mkdir -p "$dir"
  cat >"$dir/go.mod" <<MOD
module mpijob-elastic/etcd

go 1.24

require go.etcd.io/etcd/server/v3 $ETCD_VERSION
MOD
  # etcd's own main module carries replace directives, so it cannot be go-installed;
  # this wrapper calls the same entry point.
  cat >"$dir/main.go" <<'GO'
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() { etcdmain.Main(os.Args) }
GO
  (cd "$dir" && go mod tidy)
}

need() { # name env-var
  local name=$1 var=$2
  if [ -n "${!var:-}" ]; then
    [ -x "${!var}" ] || fail "$var=${!var} is not an executable" "$name" "$var"
    ln -sf "${!var}" "$bin_dir/$name"
    return 1
  fi
  [ ! -x "$bin_dir/$name" ]
}

total=$SECONDS
export CGO_ENABLED=0 GOFLAGS=-mod=mod

kube_missing=()
need kube-apiserver KUBE_APISERVER_BINARY && kube_missing+=(kube-apiserver)
need kube-controller-manager KUBE_CONTROLLER_MANAGER_BINARY && kube_missing+=(kube-controller-manager)
need kube-scheduler KUBE_SCHEDULER_BINARY && kube_missing+=(kube-scheduler)
need kubectl KUBECTL_BINARY && kube_missing+=(kubectl)
if [ ${#kube_missing[@]} -gt 0 ]; then
  timed "kubernetes-$KUBE_VERSION-modules" build_kube ||
    fail "could not resolve k8s.io/kubernetes $KUBE_VERSION from the Go module proxy" kube-apiserver KUBE_APISERVER_BINARY
  for b in "${kube_missing[@]}"; do
    var=$(echo "$b" | tr a-z- A-Z_)_BINARY
    timed "$b" bash -c "cd '$src_dir/kubernetes-$KUBE_VERSION' && go build -trimpath -ldflags '$(kube_ldflags)' -o '$bin_dir/$b.tmp' k8s.io/kubernetes/cmd/$b && mv '$bin_dir/$b.tmp' '$bin_dir/$b'" ||
      fail "go build of $b $KUBE_VERSION" "$b" "$var"
  done
fi

if [ "$node_binaries" = 1 ]; then
  node_missing=()
  need kubelet KUBELET_BINARY && node_missing+=(kubelet)
  need kubeadm KUBEADM_BINARY && node_missing+=(kubeadm)
  need kube-proxy KUBE_PROXY_BINARY && node_missing+=(kube-proxy)
  if [ ${#node_missing[@]} -gt 0 ]; then
    timed "kubernetes-$KUBE_VERSION-node-modules" add_node_tools ||
      fail "could not resolve the node binaries of k8s.io/kubernetes $KUBE_VERSION" kubelet KUBELET_BINARY
    for b in "${node_missing[@]}"; do
      var=$(echo "$b" | tr a-z- A-Z_)_BINARY
      timed "$b" bash -c "cd '$src_dir/kubernetes-$KUBE_VERSION' && go build -trimpath -ldflags '$(kube_ldflags)' -o '$bin_dir/$b.tmp' k8s.io/kubernetes/cmd/$b && mv '$bin_dir/$b.tmp' '$bin_dir/$b'" ||
        fail "go build of $b $KUBE_VERSION" "$b" "$var"
    done
  fi
fi

if need etcd ETCD_BINARY; then
  timed "etcd-$ETCD_VERSION" bash -c "$(declare -f build_etcd); src_dir='$src_dir' ETCD_VERSION='$ETCD_VERSION' build_etcd && cd '$src_dir/etcd-$ETCD_VERSION' && go build -trimpath -ldflags '-s -w' -o '$bin_dir/etcd.tmp' . && mv '$bin_dir/etcd.tmp' '$bin_dir/etcd'" ||
    fail "go build of etcd $ETCD_VERSION" etcd ETCD_BINARY
fi

for b in kwok kwokctl; do
  var=$(echo "$b" | tr a-z A-Z)_BINARY
  if need "$b" "$var"; then
    timed "$b-$KWOK_VERSION" env GOBIN="$bin_dir" go install -trimpath \
      -ldflags "-s -w -X sigs.k8s.io/kwok/pkg/consts.Version=${KWOK_VERSION#v}" \
      "sigs.k8s.io/kwok/cmd/$b@$KWOK_VERSION" ||
      fail "go install of $b $KWOK_VERSION" "$b" "$var"
  fi
done

# Giving kwokctl any Stage replaces all of its defaults, so the cluster config carries the
# defaults kwokctl would have used (taken from the pinned KWOK module) beside our own.
stages="$bin_dir/kwok-default-stages.yaml"
if [ ! -s "$stages" ]; then
  kwok_dir=$(go mod download -json "sigs.k8s.io/kwok@$KWOK_VERSION" |
    python3 -c 'import json,sys; print(json.load(sys.stdin)["Dir"])')
  for f in node/fast/node-initialize node/heartbeat-with-lease/node-heartbeat-with-lease \
    pod/fast/pod-ready pod/fast/pod-complete pod/fast/pod-delete; do
    printf -- '---\n'; cat "$kwok_dir/kustomize/stage/$f.yaml"
  done >"$stages.tmp"
  mv "$stages.tmp" "$stages"
fi

[ $((SECONDS - total)) -gt 5 ] && log "all binaries ready in $((SECONDS - total))s ($(du -sh "$bin_dir" | cut -f1) in $bin_dir)"
echo "$bin_dir"

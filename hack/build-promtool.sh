#!/usr/bin/env bash
# Builds Prometheus's promtool (default) or its server (`hack/build-promtool.sh prometheus`)
# from the Prometheus Go module into the same versioned cache as the Kubernetes binaries, and
# prints the binary's path. The rules tests run promtool; the integration test of the
# dashboard's queries scrapes a controller with the server. Both share one module download.
# The server is built without its web UI assets: the tests use its HTTP API only. Both are
# built with Prometheus's own tag `remove_all_sd`: the tests scrape static targets, and the
# service discoveries (their cloud SDKs above all) were more than half of the build's CPU.
set -euo pipefail
tool=${1:-promtool}
case "$tool" in
  promtool | prometheus) ;;
  *) echo "usage: $0 [promtool|prometheus]" >&2; exit 2 ;;
esac
version=${PROMETHEUS_MODULE_VERSION:-v0.316.0}
cache_root=${MPIJOB_ELASTIC_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/mpijob-elastic}
bin_dir="$cache_root/bin/prometheus-$version-remove_all_sd"
binary="$bin_dir/$tool"
mkdir -p "$bin_dir"
exec 9>"$cache_root/.prometheus.lock"
flock 9
if [ ! -x "$binary" ]; then
  echo "[build-promtool] go install $tool from github.com/prometheus/prometheus@$version" \
    "(about 2 minutes the first time)" >&2
  start=$SECONDS
  GOBIN="$bin_dir" go install -trimpath -tags remove_all_sd \
    "github.com/prometheus/prometheus/cmd/$tool@$version" >&2
  echo "[build-promtool] $tool built in $((SECONDS - start)) s" >&2
fi
echo "$binary"

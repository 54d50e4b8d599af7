#!/usr/bin/env bash
# The body of `make test`, after lint and the Kubernetes binaries: the KWOK suite, then the
# kind half. The builds only some tests need (`make test-tools`) and the kind cluster
# (hack/kind-up.sh) go on meanwhile in the background, logged to a file, instead of before
# the suite. `nice` puts them behind the suite only on a kernel without autogroups; with
# them (setsid gives the background a session, so an autogroup, of its own) the two share
# the CPU evenly. A test that needs a tool asks its build script, which waits on the build's
# lock and so on the background build; hack/e2e-kind.sh's kind-up waits on kind-up's lock
# the same way. A background build that failed is run again in the foreground by whoever
# needs it, and fails there loudly.
set -euo pipefail
cd "$(dirname "$0")/.."
cache_root=${MPIJOB_ELASTIC_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/mpijob-elastic}
mkdir -p "$cache_root/logs"
bg_log="$cache_root/logs/test-background.log"
log() { printf '[test %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }

log "building the test tools and starting kind in the background (log: $bg_log)"
# setsid: its own process group, so that it can be stopped whole when the suite fails.
# The two side by side: kind-up's debootstrap, apt and image steps wait on the network and
# the disk while the tools compile.
setsid bash -c 'nice -n 10 make -s test-tools & tools=$!
  nice -n 10 hack/kind-up.sh >/dev/null & kind=$!
  rc=0; wait $tools || rc=1; wait $kind || rc=1; exit $rc' \
  </dev/null >"$bg_log" 2>&1 &
background=$!
handed_over=0
# A run that ends before the kind half stops what the background started; the kind half
# (hack/e2e-kind.sh) stops its cluster itself.
stop_background() {
  if kill -0 "$background" 2>/dev/null; then
    kill -- "-$background" 2>/dev/null || true
    wait "$background" 2>/dev/null || true
  fi
  if [ $handed_over = 0 ]; then hack/kind-down.sh >>"$bg_log" 2>&1 || true; fi
}
trap stop_background EXIT

# The KWOK suite in 4 processes, each with a local cluster of its own (tests/cluster.py
# names it after the process) and a test file at a time: the tests mostly wait on
# controllers, clusters and timers (4 processes used 8.5 min of CPU in 17.6 min), so 4 of
# them on 2 cores take about 18 min where one took 45 (README's table of times).
# pytest exits 5 when it collects nothing; that must fail loudly, never pass quietly.
# Against a cluster of the user's (MPIJOB_ELASTIC_KUBECONFIG), one process: the processes'
# tests would share its nodes, priority classes, CRDs and Kueue queues.
parallel=(-n 4 --dist loadfile)
if [ -n "${MPIJOB_ELASTIC_KUBECONFIG:-}" ]; then parallel=(); fi
rc=0
.venv/bin/python -m pytest tests e2e "${parallel[@]}" --durations=30 || rc=$?
if [ $rc -eq 5 ]; then log "pytest collected no tests: failing"; exit 1; fi
[ $rc -eq 0 ] || exit $rc

if ! wait "$background"; then
  log "a background build failed (its log's tail follows); the kind half builds it again"
  tail -n 20 "$bg_log" >&2
fi
handed_over=1
hack/e2e-kind.sh

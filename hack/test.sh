#!/usr/bin/env bash
# The body of `make test`, after lint and the Kubernetes binaries: the KWOK suite and the
# kind half (hack/e2e-kind.sh: kind-up, the images, the end-to-end suite on kind, the Helm
# chart's run) side by side, and the builds only some tests need (`make test-tools`) in the
# background meanwhile. The kind half waits on timers and real containers for half of its
# time (about 50 % of 2 cores busy, measured on 2026-12-06), the KWOK suite and the builds
# keep the CPU full: one after the other they took 52 min 25 s from nothing, with the CPU
# idle for half of the last 17. A test that needs a tool asks its build script, which
# waits on the build's lock and so on the background build; a background build that failed
# is run again by whoever needs it, and fails there loudly. `nice` puts the builds behind
# the suites only on a kernel without autogroups; with them (setsid gives the builds a
# session, so an autogroup, of their own) they share the CPU evenly.
set -euo pipefail
cd "$(dirname "$0")/.."
cache_root=${MPIJOB_ELASTIC_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/mpijob-elastic}
mkdir -p "$cache_root/logs"
bg_log="$cache_root/logs/test-background.log"
kind_log="$cache_root/logs/test-kind.log"
log() { printf '[test %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }

log "building the test tools in the background (log: $bg_log)"
# setsid: a process group of its own, so that it can be stopped whole.
setsid nice -n 10 make -s test-tools </dev/null >"$bg_log" 2>&1 &
background=$!
log "the kind half runs beside the KWOK suite (its log, printed when it ends: $kind_log)"
setsid hack/e2e-kind.sh </dev/null >"$kind_log" 2>&1 &
kind_half=$!
# A run stopped early stops both; the kind half stops its own cluster when it ends, and
# here when it was stopped.
stop_all() {
  if kill -0 "$background" 2>/dev/null; then
    kill -- "-$background" 2>/dev/null || true
  fi
  if kill -0 "$kind_half" 2>/dev/null; then
    kill -- "-$kind_half" 2>/dev/null || true
    wait "$kind_half" 2>/dev/null || true
    hack/kind-down.sh >>"$kind_log" 2>&1 || true
  fi
}
trap stop_all EXIT

# The KWOK suite in 4 processes, each with a local cluster of its own (tests/cluster.py
# names it after the process) and a test file at a time: the tests mostly wait on
# controllers, clusters and timers, so 4 of them on 2 cores take about 13 min where one
# took 45 (README's table of times).
# pytest exits 5 when it collects nothing; that must fail loudly, never pass quietly.
# Against a cluster of the user's (MPIJOB_ELASTIC_KUBECONFIG), one process: the processes'
# tests would share its nodes, priority classes, CRDs and Kueue queues.
parallel=(-n 4 --dist loadfile)
if [ -n "${MPIJOB_ELASTIC_KUBECONFIG:-}" ]; then parallel=(); fi
kwok=0
.venv/bin/python -m pytest tests e2e "${parallel[@]}" --durations=30 || kwok=$?
if [ $kwok -eq 5 ]; then log "pytest collected no tests: failing"; fi
log "the KWOK suite ended (pytest's exit status $kwok); waiting for the kind half"

kind=0
wait "$kind_half" || kind=$?
cat "$kind_log"
log "the kind half ended (exit status $kind)"
if ! wait "$background"; then
  log "a background build failed (its log's tail follows); the tests that needed it built it again"
  tail -n 20 "$bg_log" >&2
fi
[ $kwok -eq 0 ] && [ $kind -eq 0 ]

# The two commands a newcomer needs are `make demo` and `make test`; the rest are the
# pieces they are made of.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
export PATH := $(CURDIR)/$(VENV)/bin:$(PATH)

.PHONY: test test-tools unit integration e2e e2e-kind lint demo bench bench-kind bench-kind-drain bench-planning bench-spot bench-capacity bench-relocation bench-foreign bench-exec-flood binaries kube-binaries cluster-up cluster-down venv lock clean

# The exact versions, with hashes, of requirements-dev.lock; the image installs
# requirements.lock (its runtime subset) the same way. The project itself goes on top
# without dependencies, so nothing unpinned can slip in.
venv: $(VENV)/.installed
$(VENV)/.installed: pyproject.toml requirements-dev.lock
	@echo "== installing the Python environment into $(VENV)"
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --require-hashes --no-deps -r requirements-dev.lock
	$(PY) -m pip install --quiet --no-deps --no-build-isolation -e .
	@touch $@

# Regenerates both lock files from pyproject.toml after a dependency changed there. Pins
# already in the files are kept; `make lock LOCK_ARGS=--upgrade` moves everything to the
# newest versions. The dev lock is constrained by the runtime one, so the two agree.
LOCK_FLAGS := --quiet --generate-hashes --allow-unsafe --strip-extras --all-build-deps \
	--no-emit-find-links --no-emit-index-url $(LOCK_ARGS)
lock: venv
	$(VENV)/bin/pip-compile $(LOCK_FLAGS) -o requirements.lock pyproject.toml
	$(VENV)/bin/pip-compile $(LOCK_FLAGS) --extra test --extra dev \
	  --constraint requirements.lock -o requirements-dev.lock pyproject.toml

# The Kubernetes binaries the local KWOK cluster runs (kube-apiserver, etcd,
# controller-manager, scheduler, kubectl, KWOK): all that `cluster-up` and `demo` need.
# Built once from their Go modules into the versioned cache, progress on stderr.
kube-binaries:
	@hack/build-binaries.sh >/dev/null

# Everything the tests need: the Kubernetes binaries, and the test tools: Prometheus's
# promtool and server (the monitoring tests), helm, the scheduler-plugins scheduler (the
# gang tests) and Kueue (the Kueue tests), the same way. Each script takes a lock of its
# own in the cache, so two runs never build the same thing at once.
binaries: kube-binaries test-tools

# In the order their tests wait longest for them in `make test`: Kueue's run for minutes.
test-tools:
	@hack/build-kueue.sh >/dev/null
	@hack/build-scheduler-plugins.sh >/dev/null
	@hack/build-helm.sh >/dev/null
	@hack/build-promtool.sh promtool >/dev/null
	@hack/build-promtool.sh prometheus >/dev/null

cluster-up: kube-binaries
	@hack/cluster-up.sh

cluster-down:
	@hack/cluster-down.sh

# A real kind cluster, also on machines without a registry (docs/kind.md). kind-up prints
# the kubeconfig path; images builds the project's images and loads them into it.
.PHONY: kind-up kind-down images
kind-up:
	@hack/kind-up.sh

kind-down:
	@hack/kind-down.sh

images:
	@hack/images.sh

lint: venv
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy
	$(VENV)/bin/lint-imports

# pytest exits 5 when it collects nothing; that must fail loudly, never pass quietly.
define run_pytest
	@$(PY) -m pytest $(1); rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "pytest collected no tests: failing" >&2; exit 1; fi; exit $$rc
endef

unit: venv
	$(call run_pytest,tests/unit)

integration: venv binaries
	$(call run_pytest,tests/integration)

e2e: venv binaries
	$(call run_pytest,e2e)

# The same suite on a real kind cluster: real containers, the shipped install, the mock
# images. Brings up what it needs, also on machines without a registry (docs/kind.md).
e2e-kind: venv
	@hack/e2e-kind.sh

# Everything: lint, unit, integration and end-to-end tests on one local KWOK cluster that
# a session fixture starts and stops, then the end-to-end suite again on kind. The test
# tools and the kind cluster are built meanwhile, in the background (hack/test.sh).
test: lint kube-binaries
	@hack/test.sh

demo: venv kube-binaries
	@$(PY) -m e2e.demo $(DEMO_ARGS)

# Issue 9's benchmarks in one table (bench/out/results.md, quoted by docs/benchmarks.md):
# worker Running -> discover_hosts.sh, single and in bursts, then a fleet of jobs from first
# create to a mass rescale for each of BENCH_SIZES (e.g. BENCH_SIZES=100,300,1000). On the
# local KWOK cluster, or on MPIJOB_ELASTIC_KUBECONFIG's.
# Then issue 20's: the largest size idle (BENCH_BASELINE=main adds that revision's
# controller) and one worker added beside training-operator 1.9.2; then issue 31's memory
# figures (bench-foreign and bench-exec-flood, without their baselines). Issue 33's mass
# changes (bench-mass) and Kueue wave (bench-wave) run for each size too, after the fleet.
BENCH_SIZES ?= 100
bench: venv binaries
	@$(PY) -m bench.report --sizes $(BENCH_SIZES)

# Issue 33: a mass rescale of half the jobs and the loss of a fifth of the nodes, each beside
# the cluster's floor (plain pods created and deleted by 32 requests in flight) measured in
# the same run; BENCH_SIZES jobs of 8 workers, about 5 minutes at 100 (docs/benchmarks.md).
# bench-floor: the floor alone, BENCH_FLOOR_PODS pods (default 1000). bench-wave: a Kueue
# admission wave of BENCH_SIZES jobs and its eviction, beside the floor. BENCH_NAMESPACES
# spreads bench-mass's jobs over that many namespaces (default 1: every job in one, where
# the jobs' PodDisruptionBudgets cost kube-controller-manager the most).
.PHONY: bench-mass bench-floor bench-wave
bench-mass: venv kube-binaries
	@$(PY) -m bench.mass --jobs $(BENCH_SIZES) --namespaces $(or $(BENCH_NAMESPACES),1)

bench-wave: venv binaries
	@$(PY) -m bench.wave --jobs $(BENCH_SIZES)

bench-floor: venv kube-binaries
	@$(PY) -m bench.floor --pods $(or $(BENCH_FLOOR_PODS),1000)

# ConfigMap change -> the launcher's mounted file, with and without the pod annotation, on
# kind (see docs/benchmarks.md). Leaves the kind cluster up; `make kind-down` stops it.
bench-kind: venv binaries
	@kubeconfig=$$(hack/kind-up.sh) && eval "$$(hack/images.sh | sed 's/^/export /')" && \
	  PATH="$$(hack/build-binaries.sh):$$PATH" $(PY) -m bench.kind_refresh \
	  --kubeconfig "$$kubeconfig" --image "$$E2E_WORKER_IMAGE"

# Scale-in edit -> victim pod gone on kind, drains ended by the launcher read vs the fixed
# drain (see docs/benchmarks.md). Needs the controller installed on the kind cluster
# (hack/e2e-kind.sh with KEEP_CLUSTER=1); leaves the cluster up.
bench-kind-drain: venv binaries
	@kubeconfig=$$(hack/kind-up.sh) && eval "$$(hack/images.sh | sed 's/^/export /')" && \
	  PATH="$$(hack/build-binaries.sh):$$PATH" $(PY) -m bench.kind_drain \
	  --kubeconfig "$$kubeconfig" --launcher-image "$$E2E_LAUNCHER_IMAGE" \
	  --worker-image "$$E2E_WORKER_IMAGE"

# How long one plan holds the event loop, for jobs up to the worker cap (no cluster).
# Issue 22: training progress lost per stop on a seeded spot trace, with notices and
# without (docs/benchmarks.md); the local KWOK cluster, about 6 minutes.
bench-spot: venv binaries
	@$(PY) -m bench.spot $(BENCH_SPOT_ARGS)

bench-planning: venv
	@$(PY) -m bench.planning

# Issue 21: how much idle GPU capacity an opportunistic job harvests, against the same
# job at a fixed size, on a scripted and a seeded random capacity trace (docs/benchmarks.md).
bench-capacity: venv binaries
	@$(PY) -m bench.capacity $(BENCH_CAPACITY_ARGS)

# Issue 30: a colocated job relocated by a cordon with 2 s and 20 s rank starts, with the
# commit hook and without, beside the controller before issue 30 (bc8de50); the local
# KWOK cluster, about 10 minutes (docs/benchmarks.md).
bench-relocation: venv binaries
	@$(PY) -m bench.relocation $(BENCH_RELOCATION_ARGS)

# Issue 31: what 40 ConfigMaps of 1 MB with our labels and no owner cost the controller's
# memory, beside the controller before the caches kept them as metadata (5441332); the
# local KWOK cluster, about 2 minutes (docs/benchmarks.md).
bench-foreign: venv kube-binaries
	@$(PY) -m bench.foreign --baseline 5441332 $(BENCH_FOREIGN_ARGS)

# Issue 31: a launcher whose process list is 1 GB, read by a scale-in's drain for 30 s,
# beside the controller before the exec read was capped (d14074a); the local KWOK cluster,
# about 2 minutes (docs/benchmarks.md).
bench-exec-flood: venv kube-binaries
	@$(PY) -m bench.exec_flood --baseline d14074a $(BENCH_EXEC_FLOOD_ARGS)

clean: cluster-down
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache

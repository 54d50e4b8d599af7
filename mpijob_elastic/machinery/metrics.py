"""Prometheus metrics: what the controller does, served on ``/metrics``.

The series live in prometheus_client's default registry, as module globals, because the
process runs one controller and every layer (queue, informers, writes) reports to the
same place without being handed an object. Hot paths only increment a counter or observe
a histogram (a lock and an addition); anything that needs a walk over the caches (jobs by
state, queue depth) is computed when Prometheus scrapes, not when things change.

docs/operations.md lists the series and what each means.
"""

from __future__ import annotations

import logging
import platform
import time
from collections import Counter as Tally
from collections.abc import Callable, Iterable, Iterator, Mapping
from datetime import UTC, datetime
from typing import Any

from aiohttp import web
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    REGISTRY,
    Counter,
    Gauge,
    Histogram,
    disable_created_metrics,
    generate_latest,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from mpijob_elastic.core import names
from mpijob_elastic.core.actions import Emit
from mpijob_elastic.core.outputs import goodput
from mpijob_elastic.core.outputs.status import QUEUE_ADMITTED
from mpijob_elastic.core.queueing import figures, kueue
from mpijob_elastic.core.queueing.kueue import Queue
from mpijob_elastic.core.settings import Settings
from mpijob_elastic.core.spec.parse import InvalidSpec, parse
from mpijob_elastic.core.times import parse_time
from mpijob_elastic.core.workers import discovered_hosts

PREFIX = "mpijob_elastic"

log = logging.getLogger("mpijob_elastic.machinery.metrics")

# The process has one registry and scrapes see its start time in process_start_time_seconds;
# a `_created` series next to every counter and histogram would double the series for that.
disable_created_metrics()  # type: ignore[no-untyped-call]

# Reconciles take milliseconds unless a write waits on the server; drains take the job's
# drain period (30 s unless annotated, up to minutes); a new worker reaches the host list
# within a reconcile or two of running.
_FAST = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)
_SLOW = (0.5, 1, 2.5, 5, 10, 20, 30, 60, 120, 300, 600, 1800)

RECONCILES = Counter(
    f"{PREFIX}_reconciles",
    "Reconciles of one job, by result: success, requeue (success with a later look "
    "asked for), error (a write failed; retried with backoff).",
    ["result"],
)
RECONCILE_SECONDS = Histogram(
    f"{PREFIX}_reconcile_duration_seconds",
    "How long one reconcile took, planning and writes.",
    ["result"],
    buckets=_FAST,
)
QUEUE_DEPTH = Gauge(f"{PREFIX}_queue_depth", "Jobs waiting for a reconcile worker.")
QUEUE_WAIT_SECONDS = Histogram(
    f"{PREFIX}_queue_wait_seconds",
    "Time a job waited in the work queue, from its add to a worker taking it.",
    buckets=_FAST,
)
WATCH_RESTARTS = Counter(
    f"{PREFIX}_watch_restarts",
    "Watches or lists that failed and were retried (not the routine end of a watch).",
    ["kind"],
)
RELISTS = Counter(
    f"{PREFIX}_relists",
    "Full lists of a kind: one per informer at start, then one per expired watch (410).",
    ["kind"],
)
API_ERRORS = Counter(
    f"{PREFIX}_api_errors",
    "Requests to the API server that failed, by HTTP code ('timeout' or 'network' when "
    "no answer came), verb and kind.",
    ["code", "verb", "kind"],
)
SCALE_OPERATIONS = Counter(
    f"{PREFIX}_scale_operations",
    "Scale operations begun (the Scaling condition turned to ScalingUp or ScalingDown).",
    ["direction"],
)
DRAIN_SECONDS = Histogram(
    f"{PREFIX}_drain_duration_seconds",
    "From a worker's drain mark to the accepted delete of its pod.",
    buckets=_SLOW,
)
RECOVERY_SECONDS = Histogram(
    f"{PREFIX}_job_recovery_seconds",
    "From a loss (fewer workers training than the job's target, the target unchanged) "
    "to the job training at its target again (docs/operations.md, Goodput).",
    buckets=(5, 10, 20, 30, 45, 60, 90, 120, 180, 300, 600, 1200, 3600),
)
ADMISSION_WAIT_SECONDS = Histogram(
    f"{PREFIX}_queue_admission_wait_seconds",
    "From the creation of a Workload the controller wrote to Kueue's Admitted condition, "
    "observed once per Workload by the leader at its write marking the Workload PodsReady: "
    "admission start (the job starts) or growth (a workload slice of a running job).",
    ["admission"],
    buckets=(1, 5, 10, 30, 60, 120, 300, 600, 1800, 3600, 7200, 14400, 43200, 86400),
)
EVICTIONS = Counter(
    f"{PREFIX}_queue_evictions",
    "Kueue's evictions of queued jobs' Workloads, by the Evicted condition's reason "
    "(Other: any reason but Kueue v1beta2's own), counted by the leader at the status write "
    "that turns the job's QueueAdmitted condition to Evicted.",
    ["reason"],
)
RUNNING_TO_LISTED_SECONDS = Histogram(
    f"{PREFIX}_running_to_listed_seconds",
    "From the controller seeing a worker pod Running to the accepted write of the "
    "discover_hosts.sh that lists it.",
    buckets=_FAST,
)

BUILD_INFO = Gauge(
    f"{PREFIX}_build_info",
    "Always 1: the controller's version, the commit it was built from ('' when unknown) and "
    "the Python running it.",
    ["version", "commit", "python"],
)
IS_LEADER = Gauge(
    f"{PREFIX}_is_leader",
    "1 while this replica holds the Lease and reconciles (or runs without leader election), "
    "0 on a standby.",
)
JOB_TRANSITIONS = Counter(
    f"{PREFIX}_job_transitions",
    "Jobs whose accepted status write turned a condition: created, succeeded, failed, "
    "suspended, resumed (Suspended turned False), relocating (Scaling turned Relocating).",
    ["transition"],
)
WORKER_CHANGES = Counter(
    f"{PREFIX}_worker_changes",
    "Workers named by the jobs' Events: replaced, retired, relocated (marked to drain off a "
    "node that is going away), drained (deleted once its ranks left), drain_timed_out "
    "(deleted when the drain period ran out); opportunistic ones (docs/capacity.md): grown "
    "(listed in idle capacity), withdrawn (unschedulable, deleted at once), preempted (by "
    "the scheduler, for a pod of higher priority).",
    ["change"],
)

FAILED_TURNS = Counter(
    f"{PREFIX}_failed_turns",
    "Turns of one job that raised before their writes (a bug, or an input the controller "
    "cannot read): the job's TurnFailed condition names the exception, and only its stops "
    "are carried out.",
)
SKIPPED_JOBS = Counter(
    f"{PREFIX}_metrics_skipped_jobs",
    "Jobs left out of a scrape's per-job series because reading them raised.",
)

# Children made once: every result and direction is exported from the start (a rate over
# a series that appears only at its first increment misses that increment), and a hot
# path skips the label lookup.
_RECONCILED = {
    result: (RECONCILES.labels(result), RECONCILE_SECONDS.labels(result))
    for result in ("success", "requeue", "error")
}
_ADMISSIONS = {a: ADMISSION_WAIT_SECONDS.labels(a) for a in (figures.START, figures.GROWTH)}
_EVICTED = {r: EVICTIONS.labels(r) for r in (*figures.EVICTION_REASONS, figures.OTHER)}
_SCALED = {direction: SCALE_OPERATIONS.labels(direction) for direction in ("out", "in")}
_TRANSITIONS = {
    t: JOB_TRANSITIONS.labels(t)
    for t in ("created", "succeeded", "failed", "suspended", "resumed", "relocating")
}
_CHANGES = {
    c: WORKER_CHANGES.labels(c)
    for c in (
        "replaced",
        "retired",
        "relocated",
        "drained",
        "drain_timed_out",
        "grown",
        "withdrawn",
        "preempted",
    )
}


def build(version: str, commit: str) -> None:
    """The process's build, once at start (app/cli.py)."""
    BUILD_INFO.labels(version, commit, platform.python_version()).set(1)


def reconciled(result: str, seconds: float) -> None:
    """One reconcile ended (a cancelled one, at shutdown, is not counted)."""
    count, duration = _RECONCILED[result]
    count.inc()
    duration.observe(seconds)


def state(status: Mapping[str, Any] | None) -> str:
    """The job's state as ``kubectl get mpijob`` shows it: its last condition that is True."""
    conditions = (status or {}).get("conditions") or []
    true = [c for c in conditions if isinstance(c, Mapping) and c.get("status") == "True"]
    return str(true[-1].get("type", "")) if true else ""


def scale_direction(old: Mapping[str, Any] | None, new: Mapping[str, Any]) -> str | None:
    """'out' or 'in' when a status write begins a scale operation, else None."""

    def scaling(status: Mapping[str, Any] | None) -> str | None:
        for c in (status or {}).get("conditions") or []:
            if isinstance(c, Mapping) and c.get("type") == "Scaling" and c.get("status") == "True":
                return str(c.get("reason"))
        return None

    before, after = scaling(old), scaling(new)
    if after == before:
        return None
    return {"ScalingUp": "out", "ScalingDown": "in"}.get(after or "")


def _true(status: Mapping[str, Any] | None) -> dict[str, str]:
    """The job's True conditions: type -> reason."""
    return {
        str(c.get("type")): str(c.get("reason", ""))
        for c in (status or {}).get("conditions") or []
        if isinstance(c, Mapping) and c.get("status") == "True"
    }


def transitions(old: Mapping[str, Any] | None, new: Mapping[str, Any]) -> list[str]:
    """The lifecycle steps a status write takes: conditions that turn, read from the status
    planned from and the one written. A restarted controller plans from the status on the
    server, so a step it had written already is not counted again."""
    before, after = _true(old), _true(new)
    taken = [
        step
        for step, condition in (
            ("created", "Created"),
            ("succeeded", "Succeeded"),
            ("failed", "Failed"),
            ("suspended", "Suspended"),
        )
        if condition in after and condition not in before
    ]
    if "Suspended" in before and "Suspended" not in after:
        taken.append("resumed")
    if after.get("Scaling") == "Relocating" != before.get("Scaling"):
        taken.append("relocating")
    return taken


def queue_evicted(old: Mapping[str, Any] | None, new: Mapping[str, Any]) -> bool:
    """A status write turns the job's QueueAdmitted condition to Evicted: the job sees an
    eviction of its Workload for the first time. A restarted or new leader plans from the
    status on the server, so it does not count that eviction again; nor does a refused
    Workload write (WorkloadRefused) in the middle of it, once it clears."""

    def reason(status: Mapping[str, Any] | None) -> str | None:
        for c in (status or {}).get("conditions") or []:
            if isinstance(c, Mapping) and c.get("type") == QUEUE_ADMITTED:
                return str(c.get("reason"))
        return None

    before = reason(old)
    return reason(new) == "Evicted" and before not in ("Evicted", "WorkloadRefused")


def event_sent(event: Emit) -> None:
    """An Event of a job's turn, handed to the recorder: the workers it names, counted."""
    for change, workers in event.counts:
        _CHANGES[change].inc(workers)


def skipped(job: Mapping[str, Any]) -> None:
    """A job whose reading raised at a scrape (a bug): counted, logged, left out."""
    SKIPPED_JOBS.inc()
    meta = job.get("metadata") if isinstance(job, Mapping) else None
    name = f"{meta.get('namespace')}/{meta.get('name')}" if isinstance(meta, Mapping) else "?"
    log.warning("job left out of the metrics", extra={"job": name}, exc_info=True)


class _JobStates(Collector):
    """``mpijob_elastic_jobs{namespace,state}``, counted from the job cache at scrape time."""

    def __init__(self) -> None:
        self.jobs: Callable[[], Iterable[Mapping[str, Any]]] = list

    def collect(self) -> Iterator[GaugeMetricFamily]:
        family = GaugeMetricFamily(
            f"{PREFIX}_jobs",
            "MPIJobs this controller manages, by namespace and state (the last True "
            "condition, as kubectl get mpijob shows it).",
            labels=["namespace", "state"],
        )
        tally: Tally[tuple[str, str]] = Tally()
        for job in self.jobs():
            try:
                tally[(job["metadata"]["namespace"], state(job.get("status")) or "Pending")] += 1
            except Exception:  # one job must not cost every other job its series
                skipped(job)
        for (namespace, job_state), count in sorted(tally.items()):
            family.add_metric([namespace, job_state], count)
        yield family


JOBS = _JobStates()
REGISTRY.register(JOBS)


class _JobDetails(Collector):
    """Per job, at scrape time, from the caches: its True conditions by type and reason
    (``mpijob_elastic_job_conditions``), and for each job that is neither finished nor
    suspended its workers listed in ``discover_hosts.sh``, its Worker replicas and its
    ``min-replicas`` (``mpijob_elastic_job_workers{count}``)."""

    def __init__(self, jobs: _JobStates) -> None:
        self._jobs = jobs
        self.config_map: Callable[[str, str], Mapping[str, Any] | None] = lambda _ns, _n: None
        # The controller's, so a job reads here as its turns read it (core/lifecycle/run_policy.py).
        self.settings = Settings()

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        conditions = GaugeMetricFamily(
            f"{PREFIX}_job_conditions",
            "MPIJobs this controller manages with a condition True, by namespace, condition "
            "type and reason (WriteRefused: the API server refuses the job's writes).",
            labels=["namespace", "type", "reason"],
        )
        workers = GaugeMetricFamily(
            f"{PREFIX}_job_workers",
            "Workers of each job neither finished nor suspended: listed (in "
            "discover_hosts.sh), desired (Worker replicas), min (min-replicas, elastic jobs "
            "only). The job's label is mpijob: Prometheus keeps job for the scrape job.",
            labels=["namespace", "mpijob", "count"],
        )
        seconds = CounterMetricFamily(
            f"{PREFIX}_job_seconds",
            "Seconds each job spent in each state since it was created (docs/operations.md, "
            "Goodput): training_full (at its target), training_reduced, resetting, waiting "
            "(for capacity or admission), stopped (suspended by the user).",
            labels=["namespace", "mpijob", "state"],
        )
        now = datetime.now(UTC)
        tally: Tally[tuple[str, str, str]] = Tally()
        for job in self._jobs.jobs():
            try:
                ns, name = job["metadata"]["namespace"], job["metadata"]["name"]
                status = job.get("status")
                true = _true(status)
                found = (
                    []
                    if {"Succeeded", "Failed", "Suspended"} & true.keys()
                    else self._workers(job, ns, name)
                )
                spent = goodput.totals((status or {}).get("goodput"), now)
            except Exception:  # one job must not cost every other job its series
                skipped(job)
                continue
            tally.update((ns, t, reason) for t, reason in true.items())
            for count, value in found:
                workers.add_metric([ns, name, count], value)
            for state, spent_seconds in sorted(spent.items()):
                seconds.add_metric([ns, name, state], spent_seconds)
        for labels, n in sorted(tally.items()):
            conditions.add_metric(list(labels), n)
        yield conditions
        yield workers
        yield seconds

    def _workers(self, job: Mapping[str, Any], ns: str, name: str) -> list[tuple[str, int]]:
        s = self.settings
        try:
            spec = parse(
                job,
                s.default_drain_seconds,
                max_workers=s.max_workers_per_job,
                default_scale_out_timeout=s.default_scale_out_timeout_seconds,
                protected_service_account=s.own_service_account,
            )
        except InvalidSpec:
            return []  # the job's InvalidSpec condition says why
        config_map = self.config_map(ns, names.config_map_name(name)) or {}
        found = [
            ("listed", len(discovered_hosts(config_map.get("data")))),
            ("desired", spec.worker.replicas),
        ]
        return found + ([("min", spec.bounds.min)] if spec.bounds.min is not None else [])


JOB_DETAILS = _JobDetails(JOBS)
REGISTRY.register(JOB_DETAILS)


class _QueueDetails(Collector):
    """Per job Kueue holds (queue-labelled), at scrape time, from the caches: its workers
    above what Kueue admitted (``mpijob_elastic_queue_workers_above_admission``), for each
    job neither finished nor being deleted (a finished job's quota is given back with it,
    and what its cleanPodPolicy keeps is the policy's)."""

    def __init__(self, jobs: _JobStates) -> None:
        self._jobs = jobs
        # The job's Queue from the caches (app/kueue.py); None: the job is not Kueue's.
        self.queue: Callable[[Mapping[str, Any]], Queue | None] = lambda _job: None
        # The pods the job controls (namespace, the job's UID).
        self.pods: Callable[[str, str], Iterable[Mapping[str, Any]]] = lambda _ns, _uid: ()

    def collect(self) -> Iterator[GaugeMetricFamily]:
        above = GaugeMetricFamily(
            f"{PREFIX}_queue_workers_above_admission",
            "Worker pods of each job Kueue holds, neither terminating nor finished, beyond "
            "the workers its Workload in force admitted (all of them while none is "
            "admitted). Must stay 0.",
            labels=["namespace", "mpijob"],
        )
        for job in self._jobs.jobs():
            try:
                found = self._above(job)
            except Exception:  # one job must not cost every other job its series
                skipped(job)
                continue
            if found is not None:
                above.add_metric(*found)
        yield above

    def _above(self, job: Mapping[str, Any]) -> tuple[list[str], int] | None:
        meta = job["metadata"]
        ended = {"Succeeded", "Failed"} & _true(job.get("status")).keys()
        queue = None if ended or meta.get("deletionTimestamp") else self.queue(job)
        queue = kueue.queued(job, queue)
        if queue is None:
            return None
        pods = self.pods(meta["namespace"], meta["uid"])
        above = figures.workers_above_admission(job, queue, pods)
        return [meta["namespace"], meta["name"]], above

    def evicted(self, job: Mapping[str, Any]) -> None:
        """The job's status write says Kueue evicted its Workload: counted by its reason."""
        try:
            reason = figures.evicted_reason(self.queue(job))
        except Exception:  # a figure must never fail the write that carries it
            log.warning("eviction reason unreadable", exc_info=True)
            reason = figures.OTHER
        _EVICTED[reason].inc()


QUEUE = _QueueDetails(JOBS)
REGISTRY.register(QUEUE)


class HostListLatency:
    """Feeds ``running_to_listed_seconds``: when each pod was seen turn Running, until a
    written ``discover_hosts.sh`` lists it.

    Only a pod seen not Running first is timed: one already running when the controller
    starts (or whose earlier states it missed) has no start to measure from, and a later
    event about it (a label, a node going away) is no start either. A pod is timed once,
    at the first accepted write that lists it.
    """

    def __init__(self) -> None:
        # (namespace, pod) of pods seen not (yet) Running.
        self._pending: set[tuple[str, str]] = set()
        # (namespace, pod) -> monotonic time it was seen turn Running.
        self._running: dict[tuple[str, str], float] = {}

    def pod(self, event_type: str, pod: Mapping[str, Any], now: float) -> None:
        meta = pod["metadata"]
        key = (meta["namespace"], meta["name"])
        phase = (pod.get("status") or {}).get("phase")
        if event_type == "DELETED" or meta.get("deletionTimestamp"):
            self._pending.discard(key)
            self._running.pop(key, None)
        elif phase != "Running":
            self._pending.add(key)
            self._running.pop(key, None)
        elif key in self._pending:
            self._pending.discard(key)
            self._running[key] = now

    def written(self, config_map: Mapping[str, Any], now: float) -> list[float]:
        """A ConfigMap write the server accepted: the waits of the hosts it lists first."""
        ns = config_map["metadata"]["namespace"]
        waits = []
        for host in discovered_hosts(config_map.get("data")):
            seen = self._running.pop((ns, host), None)
            if seen is not None:
                waits.append(now - seen)
        return waits


def drain_seconds(pod: Mapping[str, Any], now: datetime) -> float | None:
    """How long a pod whose delete was just accepted had been draining, if it was."""
    annotations = pod.get("metadata", {}).get("annotations") or {}
    since = parse_time(annotations.get(names.ANN_DRAINING_SINCE))
    return None if since is None else max(0.0, (now - since).total_seconds())


def status_written(
    old: Mapping[str, Any] | None,
    new: Mapping[str, Any],
    job: Mapping[str, Any] | None = None,
) -> None:
    """A job's status write the server accepted; ``old`` is the status it was planned
    from (not the cache's, which the write's own watch event may have updated already),
    of ``job`` (its Kueue Workloads are read for the reason of an eviction)."""
    direction = scale_direction(old, new)
    if direction is not None:
        _SCALED[direction].inc()
    for step in transitions(old, new):
        _TRANSITIONS[step].inc()
    back = goodput.recovered((old or {}).get("goodput"), new.get("goodput"))
    if back is not None:
        RECOVERY_SECONDS.observe(back)
    if job is not None and queue_evicted(old, new):
        QUEUE.evicted(job)


def workload_status_written(before: Mapping[str, Any] | None, after: Mapping[str, Any]) -> None:
    """A Workload's status write the server accepted: ``before`` the cached Workload it was
    planned from, ``after`` the answer. The write that marks it PodsReady (the job's pods
    run: core/queueing/kueue_writes.py), made once per Workload, observes its wait for
    admission."""
    if not figures.pods_ready_turned(before, after):
        return
    wait = figures.admission_wait(after)
    if wait is not None:
        _ADMISSIONS[figures.admission(after)].observe(wait)


def observe_write(written: Mapping[str, Any], latency: HostListLatency) -> None:
    """Metrics of one write the server accepted, from its answer."""
    kind = written.get("kind")
    if kind == "ConfigMap":
        for wait in latency.written(written, time.monotonic()):
            RUNNING_TO_LISTED_SECONDS.observe(wait)
    elif kind == "Pod" and written["metadata"].get("deletionTimestamp"):
        # The answer to a delete: the pod, now terminating.
        drained = drain_seconds(written, datetime.now(UTC))
        if drained is not None:
            DRAIN_SECONDS.observe(drained)


async def serve(_request: web.Request) -> web.Response:
    # Formatting every series takes well under a millisecond at this size.
    return web.Response(
        body=generate_latest(REGISTRY), headers={"Content-Type": CONTENT_TYPE_LATEST}
    )

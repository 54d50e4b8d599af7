"""The ``mpijob-elastic`` command line: its flags, their checks and defaults, and the
``Settings`` they make. Running the controller with them is ``cli.py``'s."""

from __future__ import annotations

import argparse
import math
import os
from collections.abc import Callable, Mapping
from pathlib import Path

from mpijob_elastic.app import build, leader
from mpijob_elastic.core import names
from mpijob_elastic.core.settings import KubectlDelivery, Settings
from mpijob_elastic.core.spec.fields import MAX_DURATION_SECONDS

DESCRIPTION = (
    "The ``mpijob-elastic`` command: ``run`` the controller, or ``render`` a job's children."
)
DEFAULTS = Settings()
TIMINGS = leader.Timings()


def _seconds(text: str) -> float:
    """A duration flag: what the annotations allow (core/spec/fields.py), so no default can
    make a deadline that overflows."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not 0 <= value <= MAX_DURATION_SECONDS:
        raise argparse.ArgumentTypeError(
            f"must be a number of seconds from 0 to {MAX_DURATION_SECONDS}, got {text!r}"
        )
    return value


def _whole(low: int, high: int | None = None) -> Callable[[str], int]:
    """A whole-number flag of at least ``low`` (at most ``high``): a controller with no
    reconcile worker, a job limit below 1 or a port that cannot be one would start and
    do nothing useful."""
    bounds = f"from {low} to {high}" if high is not None else f"of at least {low}"

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = low - 1
        if value < low or (high is not None and value > high):
            raise argparse.ArgumentTypeError(f"must be a whole number {bounds}, got {text!r}")
        return value

    return parse


def _settings_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--kubectl-delivery",
        choices=[d.value for d in KubectlDelivery],
        default=DEFAULTS.kubectl_delivery.value,
        help="init-container: copy kubectl into the launcher from --kubectl-image (v1 style); "
        "none: the launcher image ships kubectl on its PATH",
    )
    parser.add_argument("--kubectl-image", default=DEFAULTS.kubectl_image)
    parser.add_argument(
        "--default-drain-seconds",
        type=_seconds,
        default=DEFAULTS.default_drain_seconds,
        help=f"drain period for jobs without the {names.ANN_DRAIN_SECONDS} annotation",
    )
    parser.add_argument(
        "--default-scale-out-timeout-seconds",
        type=_seconds,
        default=DEFAULTS.default_scale_out_timeout_seconds,
        help="how long a new worker may take to run, for jobs without the "
        f"{names.ANN_SCALE_OUT_TIMEOUT} annotation (0: wait forever)",
    )
    parser.add_argument(
        "--leaving-node-taints",
        default=",".join(DEFAULTS.leaving_node_taints),
        help="comma-separated taint keys that mean a node is going away; elastic jobs move "
        "their workers off such nodes (and cordoned ones) gracefully (docs/spot.md)",
    )
    parser.add_argument(
        "--gang-scheduler-name",
        default=DEFAULTS.gang_scheduler_name,
        help="as training-operator 1.9's flag: empty or none for no gang scheduling; "
        "volcano for Volcano's PodGroup; kai-scheduler for KAI-Scheduler's; any other name "
        "for the scheduler-plugins (coscheduling) PodGroup, that name being the pods' "
        "schedulerName unless their template names one (docs/scheduling.md)",
    )
    parser.add_argument(
        "--opportunistic-priority-class",
        default=DEFAULTS.opportunistic_priority_class,
        help="the PriorityClass of opportunistic workers, for jobs without the "
        f"{names.ANN_OPPORTUNISTIC_PRIORITY_CLASS} annotation (docs/capacity.md)",
    )
    parser.add_argument(
        "--growth-backoff-max-seconds",
        type=_seconds,
        default=DEFAULTS.growth_backoff_max_seconds,
        help="the longest pause between an opportunistic job's growth probes once "
        "capacity ran out (docs/capacity.md)",
    )
    parser.add_argument(
        "--max-workers-per-job",
        type=_whole(1),
        default=DEFAULTS.max_workers_per_job,
        help="the most workers one job may ask for (Worker replicas and max-replicas); "
        "larger jobs get InvalidSpec",
    )


# Set by the Deployment from the downward API (config/manager/deployment.yaml).
OWN_NAMESPACE_ENV = "POD_NAMESPACE"
OWN_SERVICE_ACCOUNT_ENV = "POD_SERVICE_ACCOUNT"


def own_service_account(env: Mapping[str, str]) -> tuple[str, str] | None:
    """The controller's own (namespace, ServiceAccount), when the Deployment says them."""
    namespace, account = env.get(OWN_NAMESPACE_ENV), env.get(OWN_SERVICE_ACCOUNT_ENV)
    return (namespace, account) if namespace and account else None


def _names(text: str) -> tuple[str, ...]:
    return tuple(n for n in text.split(",") if n)


def skipped_namespaces(flag: str | None, env: Mapping[str, str]) -> tuple[str, ...]:
    """``--skip-namespaces``, or by default the system namespaces and the controller's own
    (where its Lease and Secrets live, and pods could run as its ServiceAccount)."""
    if flag is not None:
        return _names(flag)
    own = leader.default_namespace(env)
    return (*DEFAULTS.skipped_namespaces, *([own] if own else []))


def settings(args: argparse.Namespace) -> Settings:
    return Settings(
        own_service_account=own_service_account(os.environ),
        namespaces=_names(getattr(args, "namespaces", "") or ""),
        skipped_namespaces=skipped_namespaces(getattr(args, "skip_namespaces", None), os.environ),
        only_managed_by=getattr(args, "only_managed_by", False),
        kubectl_delivery=KubectlDelivery(args.kubectl_delivery),
        kubectl_image=args.kubectl_image,
        default_drain_seconds=args.default_drain_seconds,
        default_scale_out_timeout_seconds=args.default_scale_out_timeout_seconds,
        leaving_node_taints=tuple(t for t in args.leaving_node_taints.split(",") if t),
        max_workers_per_job=args.max_workers_per_job,
        gang_scheduler_name=args.gang_scheduler_name,
        opportunistic_priority_class=args.opportunistic_priority_class,
        growth_backoff_max_seconds=args.growth_backoff_max_seconds,
        reconcile_workers=getattr(args, "workers", DEFAULTS.reconcile_workers),
        kueue_workload_slices=getattr(args, "kueue_workload_slices", False),
        kueue_manage_jobs_without_queue_name=getattr(
            args, "kueue_manage_jobs_without_queue_name", False
        ),
    )


def _leader_election_args(run: argparse.ArgumentParser) -> None:
    run.add_argument(
        "--leader-elect",
        action="store_true",
        help="run as one of several replicas: only the holder of a Lease reconciles and "
        "writes, the others keep their caches synced and wait (docs/operations.md)",
    )
    run.add_argument(
        "--leader-elect-lease-duration",
        type=float,
        default=TIMINGS.lease_duration,
        help="seconds a standby waits, from the last renewal it saw, before taking over",
    )
    run.add_argument(
        "--leader-elect-renew-deadline",
        type=float,
        default=TIMINGS.renew_deadline,
        help="seconds a leader keeps trying to renew before it stops writing and exits",
    )
    run.add_argument(
        "--leader-elect-retry-period",
        type=float,
        default=TIMINGS.retry_period,
        help="seconds between tries to acquire or renew the Lease",
    )
    run.add_argument("--leader-elect-resource-name", default="mpijob-elastic")
    run.add_argument(
        "--leader-elect-resource-namespace",
        default="",
        help="default: the pod's own namespace ($POD_NAMESPACE, or the ServiceAccount's)",
    )


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="mpijob-elastic", description=DESCRIPTION)
    p.add_argument("--version", action="version", version=build.describe(os.environ))
    sub = p.add_subparsers(dest="command", required=True)

    run = sub.add_parser("run", help="run the controller")
    run.add_argument("--kubeconfig", help="default: $KUBECONFIG, ~/.kube/config, or in-cluster")
    run.add_argument(
        "--namespaces",
        default="",
        help="comma-separated; default: all but those of --skip-namespaces",
    )
    run.add_argument(
        "--skip-namespaces",
        help="comma-separated namespaces not served when --namespaces is not given; "
        "default: kube-system, kube-public and the controller's own; '' serves them all",
    )
    run.add_argument(
        "--only-managed-by",
        action="store_true",
        help=f"manage only jobs with spec.runPolicy.managedBy: {names.MANAGED_BY} "
        "(to run beside training-operator 1.9)",
    )
    run.add_argument("--workers", type=_whole(1), default=DEFAULTS.reconcile_workers)
    run.add_argument(
        "--kueue-workload-slices",
        action="store_true",
        help="Kueue runs with its ElasticJobsViaWorkloadSlices feature gate: elastic jobs "
        "labelled for a Kueue queue grow and shrink by workload slices (docs/scheduling.md)",
    )
    run.add_argument(
        "--kueue-manage-jobs-without-queue-name",
        action="store_true",
        help="Kueue runs with manageJobsWithoutQueueName: a job without the "
        "kueue.x-k8s.io/queue-name label waits in its namespace's LocalQueue 'default' "
        "(docs/scheduling.md)",
    )
    run.add_argument(
        "--health-port",
        type=_whole(0, 65535),
        default=0,
        help="serve /healthz and /readyz on this port (0: not at all)",
    )
    run.add_argument(
        "--metrics-port",
        type=_whole(0, 65535),
        default=0,
        help="serve Prometheus metrics on /metrics on this port (0: not at all), over HTTPS "
        "to bearer tokens allowed to get /metrics (docs/operations.md); the same port as "
        "--health-port serves all three paths over HTTPS, the probes without a token",
    )
    run.add_argument(
        "--metrics-cert-dir",
        default="",
        help="a directory holding tls.crt and tls.key for /metrics, read again when they "
        "change (default: a self-signed certificate made at start)",
    )
    _leader_election_args(run)
    run.add_argument("--log-format", choices=["text", "json"], default="text")
    run.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    _settings_args(run)

    render = sub.add_parser(
        "render", help="print the children the controller would create for an MPIJob manifest"
    )
    render.add_argument("file", type=Path, help="an MPIJob manifest (YAML), '-' for stdin")
    _settings_args(render)
    return p

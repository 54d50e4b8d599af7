"""The ``mpijob-elastic`` command: ``run`` the controller, or ``render`` a job's children."""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import sys
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import yaml
from aiohttp import web

from mpijob_elastic import clients, health, logs, memory, metrics, names
from mpijob_elastic.actions import Create, Observed, Replace
from mpijob_elastic.plan import plan
from mpijob_elastic.reconciler import Controller
from mpijob_elastic.settings import KubectlDelivery, Settings
from mpijob_elastic.spec import InvalidSpec, parse
from mpijob_elastic.writer import WRITE_CONCURRENCY

DEFAULTS = Settings()


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
        type=float,
        default=DEFAULTS.default_drain_seconds,
        help=f"drain period for jobs without the {names.ANN_DRAIN_SECONDS} annotation",
    )
    parser.add_argument(
        "--default-scale-out-timeout-seconds",
        type=float,
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
        "--max-workers-per-job",
        type=int,
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


def _settings(args: argparse.Namespace) -> Settings:
    namespaces = tuple(n for n in (getattr(args, "namespaces", "") or "").split(",") if n)
    return Settings(
        own_service_account=own_service_account(os.environ),
        namespaces=namespaces,
        only_managed_by=getattr(args, "only_managed_by", False),
        kubectl_delivery=KubectlDelivery(args.kubectl_delivery),
        kubectl_image=args.kubectl_image,
        default_drain_seconds=args.default_drain_seconds,
        default_scale_out_timeout_seconds=args.default_scale_out_timeout_seconds,
        leaving_node_taints=tuple(t for t in args.leaving_node_taints.split(",") if t),
        max_workers_per_job=args.max_workers_per_job,
        reconcile_workers=getattr(args, "workers", DEFAULTS.reconcile_workers),
    )


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="mpijob-elastic", description=__doc__)
    sub = p.add_subparsers(dest="command", required=True)

    run = sub.add_parser("run", help="run the controller")
    run.add_argument("--kubeconfig", help="default: $KUBECONFIG, ~/.kube/config, or in-cluster")
    run.add_argument("--namespaces", default="", help="comma-separated; default: all")
    run.add_argument(
        "--only-managed-by",
        action="store_true",
        help=f"manage only jobs with spec.runPolicy.managedBy: {names.MANAGED_BY} "
        "(to run beside training-operator 1.9)",
    )
    run.add_argument("--workers", type=int, default=DEFAULTS.reconcile_workers)
    run.add_argument(
        "--health-port",
        type=int,
        default=0,
        help="serve /healthz and /readyz on this port (0: not at all)",
    )
    run.add_argument(
        "--metrics-port",
        type=int,
        default=0,
        help="serve Prometheus metrics on /metrics on this port (0: not at all); the same "
        "port as --health-port serves all three paths",
    )
    run.add_argument("--log-format", choices=["text", "json"], default="text")
    run.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    _settings_args(run)

    render = sub.add_parser(
        "render", help="print the children the controller would create for an MPIJob manifest"
    )
    render.add_argument("file", type=Path, help="an MPIJob manifest (YAML), '-' for stdin")
    _settings_args(render)
    return p


def _kubeconfig_path(kubeconfig: str | None) -> str | None:
    """The kubeconfig to use, or None to use the pod's in-cluster ServiceAccount."""
    path = kubeconfig or os.environ.get("KUBECONFIG") or str(Path.home() / ".kube" / "config")
    return path if kubeconfig or Path(path).exists() else None


async def _load_config(kubeconfig: str | None, settings: Settings) -> clients.Clients:
    configuration = await clients.load_configuration(_kubeconfig_path(kubeconfig))
    # Outside a batch each reconcile worker makes one write at a time; batches share
    # WRITE_CONCURRENCY slots. So no write ever waits for a connection in normal operation.
    return clients.connect(
        configuration, write_connections=settings.reconcile_workers + WRITE_CONCURRENCY
    )


async def _run(args: argparse.Namespace) -> None:
    settings = _settings(args)
    apis = await _load_config(args.kubeconfig, settings)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    try:
        controller = Controller(apis.write, settings, watch_api=apis.watch)
        shared = args.metrics_port == args.health_port
        probes = (
            health.HealthServer(
                args.health_port,
                controller.problems,
                extra={"/metrics": metrics.serve} if shared else None,
            )
            if args.health_port
            else None
        )
        metrics_site: web.AppRunner | None = None
        try:
            # Up before the caches sync, so the liveness probe answers during a long first
            # list, and the metrics show the lists' progress.
            if probes is not None:
                await probes.start()
            if args.metrics_port and not shared:
                metrics_site = await health.serve(
                    web.Application(), {"/metrics": metrics.serve}, args.metrics_port
                )
            await controller.start()
            # The first list's transients go now, not a minute later (memory.py).
            memory.release()
            trims = asyncio.create_task(memory.release_periodically(), name="malloc-trim")
            await stop.wait()
            trims.cancel()
        finally:
            await controller.stop()
            if probes is not None:
                await probes.stop()
            if metrics_site is not None:
                await metrics_site.cleanup()
    finally:
        await apis.close()


def _running(pod: dict[str, Any]) -> dict[str, Any]:
    """The status of a pod whose containers all run, as a kubelet would report it."""
    containers = pod["spec"].get("containers") or []
    return {
        "phase": "Running",
        "containerStatuses": [
            {"name": c["name"], "ready": True, "state": {"running": {}}} for c in containers
        ],
    }


def render_children(job: dict[str, Any], settings: Settings) -> list[dict[str, Any]]:
    """Every child of a job once its workers run: the plans of a job starting up, replayed."""
    job.setdefault("metadata", {}).setdefault("namespace", "default")
    job["metadata"].setdefault("uid", "<uid>")
    objects: dict[tuple[str, str], dict[str, Any]] = {}
    now = datetime.now(UTC)
    for _ in range(3):
        pods = [{**o, "status": _running(o)} for (kind, _), o in objects.items() if kind == "Pod"]

        def get(kind: str, name: str) -> dict[str, Any] | None:
            return objects.get((kind, name))

        launcher = names.launcher_name(job["metadata"]["name"])
        observed = Observed(
            job=job,
            pods=pods,
            config_map=get("ConfigMap", names.config_map_name(job["metadata"]["name"])),
            service_account=get("ServiceAccount", launcher),
            role=get("Role", launcher),
            role_binding=get("RoleBinding", launcher),
        )
        for action in plan(observed, settings, now).actions:
            if isinstance(action, Create | Replace):
                objects[(action.obj["kind"], action.obj["metadata"]["name"])] = action.obj
    return list(objects.values())


def _render(args: argparse.Namespace) -> int:
    text = sys.stdin.read() if str(args.file) == "-" else args.file.read_text()
    jobs = [
        d for d in yaml.safe_load_all(text) if isinstance(d, dict) and d.get("kind") == names.KIND
    ]
    if not jobs:
        print(f"{args.file}: no {names.KIND} found", file=sys.stderr)
        return 1
    settings = _settings(args)
    out: list[dict[str, Any]] = []
    for job in jobs:
        try:
            parse(job, settings.default_drain_seconds)
        except InvalidSpec as err:
            name = job.get("metadata", {}).get("name", "?")
            for error in err.errors:
                print(f"MPIJob {name}: {error}", file=sys.stderr)
            return 1
        out += render_children(job, settings)
    yaml.safe_dump_all(out, sys.stdout, sort_keys=False)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if args.command == "render":
        return _render(args)
    logs.setup(args.log_format, args.log_level)
    asyncio.run(_run(args))
    return 0


if __name__ == "__main__":
    sys.exit(main())

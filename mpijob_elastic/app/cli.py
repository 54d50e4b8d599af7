"""The ``mpijob-elastic`` command: ``run`` the controller, or ``render`` a job's children."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import sys
from collections.abc import Awaitable, Sequence
from pathlib import Path
from typing import Any

from aiohttp import web

from mpijob_elastic.app import (
    build,
    flags,
    health,
    leader,
    logs,
    memory,
    metrics_guard,
    render,
    stacks,
    tls,
)
from mpijob_elastic.app.controller import Controller
from mpijob_elastic.core.settings import Settings
from mpijob_elastic.machinery import clients, metrics
from mpijob_elastic.machinery.kube import Kube
from mpijob_elastic.machinery.writer import WRITE_CONCURRENCY

log = logging.getLogger("mpijob_elastic.app.cli")

# How long a leader told to stop lets its reconciles in flight finish before it cancels
# them and releases the Lease: well inside the pod's 30 s termination grace period.
SHUTDOWN_GRACE_SECONDS = 5.0


def _kubeconfig_path(kubeconfig: str | None) -> str | None:
    """The kubeconfig to use, or None to use the pod's in-cluster ServiceAccount."""
    if kubeconfig and not Path(kubeconfig).is_file():
        raise SystemExit(f"mpijob-elastic run: --kubeconfig {kubeconfig}: no such file")
    path = kubeconfig or os.environ.get("KUBECONFIG") or str(Path.home() / ".kube" / "config")
    return path if kubeconfig or Path(path).exists() else None


async def _load_config(kubeconfig: str | None, settings: Settings) -> clients.Clients:
    path = _kubeconfig_path(kubeconfig)
    try:
        configuration = await clients.load_configuration(path)
    except clients.ConfigError as err:
        where = (
            f"kubeconfig {path}"
            if path
            else "no kubeconfig (--kubeconfig, $KUBECONFIG, ~/.kube/config), and in-cluster"
        )
        raise SystemExit(f"mpijob-elastic run: {where}: {err}") from None
    # Every write takes a slot of its lane (WRITE_CONCURRENCY in all); the reports of
    # refused writes, one per reconcile worker at most, go outside them. So no write ever
    # waits for a connection in normal operation; nor for the metrics' token reviews, which
    # have connections of their own.
    writes = settings.reconcile_workers + WRITE_CONCURRENCY + metrics_guard.REVIEWS_AT_ONCE
    return clients.connect(configuration, write_connections=writes)


def _elector(args: argparse.Namespace, apis: clients.Clients) -> leader.Elector:
    timings = leader.Timings(
        args.leader_elect_lease_duration,
        args.leader_elect_renew_deadline,
        args.leader_elect_retry_period,
    )
    namespace = args.leader_elect_resource_namespace or leader.default_namespace(os.environ)
    problems = timings.problems() + (
        [] if namespace else ["outside a pod, --leader-elect-resource-namespace is needed"]
    )
    if problems:
        raise SystemExit(f"mpijob-elastic: {'; '.join(problems)}")
    # The watch client: its connections are never all taken, so a renewal never waits
    # behind a burst of writes (clients.py).
    return leader.Elector(
        Kube(apis.watch),
        namespace,
        args.leader_elect_resource_name,
        leader.default_identity(),
        timings,
    )


async def _first(*aws: Awaitable[Any]) -> set[asyncio.Task[Any]]:
    """Wait for the first of ``aws`` to finish; cancel the others."""
    tasks = [asyncio.ensure_future(a) for a in aws]
    done, pending = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    for task in pending:
        task.cancel()
    await asyncio.gather(*pending, return_exceptions=True)
    return done


async def _lead(controller: Controller, elector: leader.Elector, stop: asyncio.Event) -> int:
    """Wait for the Lease, reconcile while holding it; the process's exit status."""
    controller.standby = True
    acquire = asyncio.ensure_future(elector.acquire())
    if acquire not in await _first(acquire, stop.wait()):
        return 0  # stopped while standing by: nothing to hand over
    acquire.result()  # only a Lease actually held may start the workers
    controller.start_workers()
    hold = asyncio.ensure_future(elector.hold())
    if hold in await _first(hold, stop.wait()):
        # Deposed: stop writing now, then exit non-zero so the pod restarts as a standby.
        await controller.stop_workers(0)
        log.error("lost the lease; exiting", extra={"reason": hold.result()})
        return 1
    # Told to stop: no new work; keep renewing while the reconciles in flight finish.
    hold = asyncio.ensure_future(elector.hold())
    if hold in await _first(hold, controller.stop_workers(SHUTDOWN_GRACE_SECONDS)):
        await controller.stop_workers(0)
        log.error("lost the lease while stopping", extra={"reason": hold.result()})
        return 1
    await elector.release()
    return 0


async def _run(args: argparse.Namespace) -> int:
    settings = flags.settings(args)
    metrics.build(build.version(), build.commit(os.environ))
    apis = await _load_config(args.kubeconfig, settings)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    stacks.install(loop)
    try:
        elector = _elector(args, apis) if args.leader_elect else None
        if elector is None:
            metrics.IS_LEADER.set(1)  # the only replica: it reconciles from the start
        controller = Controller(
            apis.write,
            settings,
            watch_api=apis.watch,
            lease=None if elector is None else (elector.namespace, elector.name),
            guard_metrics=bool(args.metrics_port),
        )
        role = None if elector is None else lambda: "leader" if elector.leading else "standby"
        shared = args.metrics_port == args.health_port
        guarded = metrics_guard.MetricsGuard(controller.kube, metrics.serve)
        certificate = (
            tls.Certificate(Path(args.metrics_cert_dir) if args.metrics_cert_dir else None)
            if args.metrics_port
            else None
        )
        listening = certificate.listening if certificate is not None else None
        probes = (
            health.HealthServer(
                args.health_port,
                controller.problems,
                role,
                extra={metrics_guard.PATH: guarded} if shared else None,
                ssl_context=listening if shared else None,
            )
            if args.health_port
            else None
        )
        metrics_site: web.AppRunner | None = None
        trims: asyncio.Task[None] | None = None
        try:
            # Up before the caches sync, so the liveness probe answers during a long first
            # list, and the metrics show the lists' progress.
            try:
                if probes is not None:
                    await probes.start()
                if args.metrics_port and not shared:
                    metrics_site = await health.serve(
                        web.Application(),
                        {metrics_guard.PATH: guarded},
                        args.metrics_port,
                        listening,
                    )
            except OSError as err:
                raise SystemExit(f"mpijob-elastic run: cannot serve a port: {err}") from None
            # A SIGTERM during a long first list ends the process at once: it holds no
            # Lease and has made no writes.
            sync = asyncio.ensure_future(controller.sync())
            if sync not in await _first(sync, stop.wait()):
                return 0
            sync.result()
            # The first list's transients go now, not a minute later (memory.py).
            memory.release()
            trims = asyncio.create_task(memory.release_periodically(), name="malloc-trim")
            if elector is not None:
                return await _lead(controller, elector, stop)
            controller.start_workers()
            await stop.wait()
            return 0
        finally:
            if trims is not None:
                trims.cancel()
            await controller.stop()
            if probes is not None:
                await probes.stop()
            if metrics_site is not None:
                await metrics_site.cleanup()
    finally:
        await apis.close()


def main(argv: Sequence[str] | None = None) -> int:
    args = flags.parser().parse_args(argv)
    if args.command == "render":
        return render.run(args.file, flags.settings(args))
    logs.setup(args.log_format, args.log_level)
    return asyncio.run(_run(args))


if __name__ == "__main__":
    sys.exit(main())

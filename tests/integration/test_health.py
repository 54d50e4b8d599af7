"""The probes' endpoints on a real controller process."""

from __future__ import annotations

import asyncio
import json
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path

import aiohttp
import pytest

from mpijob_elastic.app.controller import Controller
from mpijob_elastic.app.health import HealthServer
from mpijob_elastic.core import names
from mpijob_elastic.core.settings import Settings
from mpijob_elastic.machinery import clients
from mpijob_elastic.machinery.informer import STALE_AFTER_SECONDS
from mpijob_elastic.machinery.write_health import WRITE_STALL_SECONDS
from tests.cluster import Cluster
from tests.controller import ControllerProcess, StartController, free_port, wait_for
from tests.faults import proxied_kubeconfig, tcp_proxy
from tests.manifests import mpijob

# Without the CRD the job cache never syncs, and the start-up check reports it unready.
pytestmark = pytest.mark.usefixtures("crd")


def get(port: int, path: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as answer:
            return answer.status, answer.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode()


def test_a_synced_controller_is_live_and_ready(
    namespace: str, start_controller: StartController
) -> None:
    port = free_port()
    controller = start_controller(namespace, args=("--health-port", str(port)))
    assert get(port, "/healthz") == (200, "ok\n")
    # Ready once the reconcile workers run, which follows the caches' sync at once.
    wait_for(lambda: get(port, "/readyz") == (200, "ok\n"), 30, "/readyz to answer ok")
    controller.stop()
    try:
        get(port, "/healthz")
    except urllib.error.URLError:
        pass
    else:
        raise AssertionError("the health server outlived the controller")


async def test_a_controller_that_cannot_write_turns_unready_until_a_write_goes_through(
    cluster: Cluster, namespace: str
) -> None:
    """The connection-pool stall (test_connections.py): the process lives, its watches are
    fine, but no write gets a connection. /readyz must say so."""
    apis = clients.connect(
        await clients.load_configuration(cluster.kubeconfig), write_connections=1
    )
    controller = Controller(apis.write, Settings(namespaces=(namespace,)), watch_api=apis.watch)
    port = free_port()
    server = HealthServer(port, controller.problems)
    held = None
    try:
        await server.start()
        await controller.sync()
        controller.start_workers()
        async with aiohttp.ClientSession() as session:

            async def readyz() -> tuple[int, str]:
                async with session.get(f"http://127.0.0.1:{port}/readyz") as answer:
                    return answer.status, await answer.text()

            assert await readyz() == (200, "ok\n")
            # A long request holds the only write connection, as the watches once did.
            held = await apis.write.call_api(
                f"/api/v1/namespaces/{namespace}/configmaps",
                "GET",
                query_params=[("watch", "true"), ("timeoutSeconds", 300)],
                auth_settings=["BearerToken"],
                _preload_content=False,
            )
            cluster.kubectl(
                "create", "-n", namespace, "-f", "-", input=json.dumps(mpijob("stalled"))
            )

            async def until(check: Callable[[int, str], bool], within: float) -> tuple[int, str]:
                deadline = time.monotonic() + within
                while True:
                    status, text = await readyz()
                    if check(status, text) or time.monotonic() > deadline:
                        return status, text
                    await asyncio.sleep(0.5)

            # Each write waits WRITE_CONNECT_TIMEOUT_SECONDS for a connection and fails.
            status, text = await until(lambda s, _: s == 503, 4 * WRITE_STALL_SECONDS)
            assert status == 503
            assert "no answer from the API server to a write" in text
            # Caches and workers are fine: the write stall is the only problem.
            assert text.count("\n") == 1

            held.close()
            held = None
            # The queue retries the job with backoff; its first answered write clears it.
            status, text = await until(lambda s, _: s == 200, 90)
            assert (status, text) == (200, "ok\n")
            assert cluster.raw(
                "GET",
                f"/api/v1/namespaces/{namespace}/configmaps/{names.config_map_name('stalled')}",
            ), "the job's writes went through"
    finally:
        if held is not None:
            held.close()
        await controller.stop()
        await server.stop()
        await apis.close()


def test_a_controller_whose_watches_died_turns_unready_and_back(
    cluster: Cluster, namespace: str, tmp_path: Path
) -> None:
    """The API server out of reach for the watches: the informers keep retrying, and once
    none has heard from the server for STALE_AFTER_SECONDS the controller is unready."""
    port = free_port()
    with tcp_proxy(cluster.kubeconfig) as proxy:
        kubeconfig = proxied_kubeconfig(cluster.kubeconfig, proxy.port, tmp_path / "proxied")
        controller = ControllerProcess(
            Cluster(kubeconfig, cluster.kubectl_path),
            (namespace,),
            tmp_path / "controller.log",
            ("--health-port", str(port)),
        )
        controller.start()
        try:
            wait_for(lambda: get(port, "/readyz") == (200, "ok\n"), 30, "/readyz to answer ok")
            proxy.cut()
            _, text = wait_for(
                lambda: (answer := get(port, "/readyz"))[0] == 503 and answer,
                STALE_AFTER_SECONDS + 60,
                "/readyz to turn unready",
            )
            assert "not synced or not heard from" in text
            # Still live: the process and its loop are fine, only the server is away.
            assert get(port, "/healthz") == (200, "ok\n")
            proxy.restore()
            wait_for(lambda: get(port, "/readyz") == (200, "ok\n"), 120, "/readyz ready again")
        finally:
            controller.stop()
            print(f"--- controller log ---\n{controller.logs()[-20000:]}")


def test_a_controller_started_while_the_server_is_away_waits_for_it_and_turns_ready(
    cluster: Cluster, namespace: str, tmp_path: Path
) -> None:
    """What the server serves (Kueue's API, the gang scheduler's PodGroup) is asked once at
    start: an unreachable server is waited out there, as the informers wait it out, and the
    controller neither exits nor skips the question."""
    port = free_port()
    with tcp_proxy(cluster.kubeconfig) as proxy:
        proxy.cut()
        kubeconfig = proxied_kubeconfig(cluster.kubeconfig, proxy.port, tmp_path / "proxied")
        controller = ControllerProcess(
            Cluster(kubeconfig, cluster.kubectl_path),
            (namespace,),
            tmp_path / "controller.log",
            ("--health-port", str(port), "--gang-scheduler-name", "scheduler-plugins"),
        )
        controller.launch()
        try:
            wait_for(
                lambda: "API discovery: no answer yet" in controller.logs(), 60, "a retry logged"
            )
            assert get(port, "/readyz")[0] == 503
            assert controller.proc is not None
            assert controller.proc.poll() is None
            proxy.restore()
            wait_for(lambda: get(port, "/readyz") == (200, "ok\n"), 120, "/readyz ready")
        finally:
            controller.stop()
            print(f"--- controller log ---\n{controller.logs()[-20000:]}")

"""The health server answers what its readiness callback says (no cluster)."""

from __future__ import annotations

import aiohttp

from mpijob_elastic.app.health import HealthServer
from mpijob_elastic.machinery import metrics
from tests.controller import free_port
from tests.metric_names import total


async def test_readyz_lists_the_problems_and_healthz_still_answers() -> None:
    problems = ["Informer(pods): not synced or not heard from"]
    port = free_port()
    server = HealthServer(port, lambda: problems)
    await server.start()
    try:
        async with aiohttp.ClientSession() as session:
            async with session.get(f"http://127.0.0.1:{port}/readyz") as answer:
                assert answer.status == 503
                assert await answer.text() == f"{problems[0]}\n"
            async with session.get(f"http://127.0.0.1:{port}/healthz") as answer:
                assert answer.status == 200
            problems.clear()
            async with session.get(f"http://127.0.0.1:{port}/readyz") as answer:
                assert answer.status == 200
    finally:
        await server.stop()


async def test_metrics_can_share_the_health_port() -> None:
    """--metrics-port equal to --health-port: one server, three paths."""
    port = free_port()
    server = HealthServer(port, list, extra={"/metrics": metrics.serve})
    await server.start()
    try:
        async with aiohttp.ClientSession() as session:
            async with session.get(f"http://127.0.0.1:{port}/metrics") as answer:
                assert answer.status == 200
                assert answer.headers["Content-Type"].startswith("text/plain")
                text = await answer.text()
            async with session.get(f"http://127.0.0.1:{port}/readyz") as answer:
                assert answer.status == 200
    finally:
        await server.stop()
    assert f'{total(metrics.RECONCILES)}{{result="error"}}' in text

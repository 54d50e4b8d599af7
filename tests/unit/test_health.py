"""The health server answers what its readiness callback says (no cluster)."""

from __future__ import annotations

import aiohttp
import pytest

from mpijob_elastic.app.health import HealthServer
from mpijob_elastic.app.tls import Certificate
from mpijob_elastic.machinery import metrics
from tests.controller import free_port, scraper_tls
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
    """--metrics-port equal to --health-port: one server, three paths, over TLS only."""
    port = free_port()
    certificate = Certificate(None)
    server = HealthServer(
        port, list, extra={"/metrics": metrics.serve}, ssl_context=certificate.listening
    )
    await server.start()
    try:
        async with aiohttp.ClientSession() as session:
            url = f"https://127.0.0.1:{port}"
            async with session.get(f"{url}/metrics", ssl=scraper_tls()) as answer:
                assert answer.status == 200
                assert answer.headers["Content-Type"].startswith("text/plain")
                text = await answer.text()
            async with session.get(f"{url}/readyz", ssl=scraper_tls()) as answer:
                assert answer.status == 200
            # Nothing in clear on the port that serves /metrics.
            with pytest.raises(aiohttp.ClientError):
                async with session.get(f"http://127.0.0.1:{port}/metrics") as answer:
                    pass
    finally:
        await server.stop()
    assert f'{total(metrics.RECONCILES)}{{result="error"}}' in text

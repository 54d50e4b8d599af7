"""``/healthz`` and ``/readyz`` for the kubelet's probes.

* ``/healthz`` answers from the event loop itself, so an answer proves the loop is not
  blocked; a loop that stops answering gets the pod restarted by the liveness probe.
* ``/readyz`` says whether the controller can do its job: every informer synced and its
  watch heard from within two bookmark periods (``Informer.healthy``), and every reconcile
  worker task alive, and no write left without an answer from the API server for
  ``WRITE_STALL_SECONDS`` (``WriteHealth``). A controller whose watches died, or that
  cannot write (its connections stalled, the server unreachable), is taken out of
  readiness, so ``kubectl get deploy`` and alerts on unavailable replicas show it. With
  leader election a standby is ready too (its caches are what a fast take-over needs; it
  runs no workers), and the body says which of the two each replica is.

``/metrics`` (metrics.py) is served by the same server when ``--metrics-port`` equals
``--health-port``, and by a second one on its own port otherwise; whichever server serves it
speaks TLS only (tls.py), the probes too when they share it.
"""

from __future__ import annotations

import logging
import ssl
from collections.abc import Awaitable, Callable, Mapping

from aiohttp import web

log = logging.getLogger("mpijob_elastic.app.health")

Handler = Callable[[web.Request], Awaitable[web.Response]]


class HealthServer:
    def __init__(
        self,
        port: int,
        ready: Callable[[], list[str]],
        role: Callable[[], str] | None = None,
        *,
        extra: Mapping[str, Handler] | None = None,
        ssl_context: ssl.SSLContext | None = None,
    ) -> None:
        """``ready`` returns what keeps the controller from being ready (empty: ready);
        ``role``, with leader election, whether this replica leads or stands by; ``extra``
        adds routes (``/metrics`` when it shares the port, with its ``ssl_context``)."""
        self.port = port
        self._ready = ready
        self._role = role
        self._extra = dict(extra or {})
        self._ssl = ssl_context
        self._runner: web.AppRunner | None = None

    async def _healthz(self, _request: web.Request) -> web.Response:
        return web.Response(text="ok\n")

    async def _readyz(self, _request: web.Request) -> web.Response:
        problems = self._ready()
        role = "" if self._role is None else f"{self._role()}\n"
        if problems:
            return web.Response(status=503, text=role + "".join(f"{p}\n" for p in problems))
        return web.Response(text=f"ok\n{role}")

    async def start(self) -> None:
        app = web.Application()
        app.router.add_get("/healthz", self._healthz)
        app.router.add_get("/readyz", self._readyz)
        self._runner = await serve(app, self._extra, self.port, self._ssl)

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()


async def serve(
    app: web.Application,
    routes: Mapping[str, Handler],
    port: int,
    ssl_context: ssl.SSLContext | None = None,
) -> web.AppRunner:
    for path, handler in routes.items():
        app.router.add_get(path, handler)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, port=port, ssl_context=ssl_context).start()
    paths = sorted({r.resource.canonical for r in app.router.routes() if r.resource})
    scheme = "https" if ssl_context is not None else "http"
    log.info("serving", extra={"port": port, "paths": ",".join(paths), "scheme": scheme})
    return runner

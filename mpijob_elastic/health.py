"""``/healthz`` and ``/readyz`` for the kubelet's probes.

* ``/healthz`` answers from the event loop itself, so an answer proves the loop is not
  blocked; a loop that stops answering gets the pod restarted by the liveness probe.
* ``/readyz`` says whether the controller can do its job: every informer synced and its
  watch heard from within two bookmark periods (``Informer.healthy``), and every reconcile
  worker task alive, and no write left without an answer from the API server for
  ``WRITE_STALL_SECONDS`` (``WriteHealth``). A controller whose watches died, or that
  cannot write (its connections stalled, the server unreachable), is taken out of
  readiness, so ``kubectl get deploy`` and alerts on unavailable replicas show it.

``/metrics`` (metrics.py) is served by the same server when ``--metrics-port`` equals
``--health-port``, and by a second one on its own port otherwise.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Mapping

from aiohttp import web

from mpijob_elastic.clients import WRITE_CONNECT_TIMEOUT_SECONDS

log = logging.getLogger("mpijob_elastic.health")

Handler = Callable[[web.Request], Awaitable[web.Response]]

# A write has this long to get an answer, any answer, from the API server before the
# controller calls itself unable to write: twice the bound on waiting for a connection
# (clients.py), so a write that waits out one full connect and then goes through does
# not flip readiness, while a stalled pool (every write failing after that bound) does
# within two attempts. A healthy write is answered in milliseconds.
WRITE_STALL_SECONDS = 2 * WRITE_CONNECT_TIMEOUT_SECONDS


class WriteHealth:
    """Whether requests to the API server get answers: the "cannot write" of /readyz.

    A request is answered when any HTTP status comes back (a 409 or a 503 is the server
    speaking); it goes unanswered when it times out or its connection fails. The oldest
    request that is still waiting, or that went unanswered with no answer to any request
    since, is how long the controller has been unable to write. An idle controller makes
    no requests and stays ready; a stalled one retries its failed writes with backoff, so
    it stays unready until one goes through.
    """

    def __init__(self) -> None:
        self._pending: dict[int, float] = {}
        self._next = 0
        self._unanswered_since: float | None = None

    def started(self, now: float) -> int:
        self._next += 1
        self._pending[self._next] = now
        return self._next

    def finished(self, token: int, answered: bool | None, now: float) -> None:
        """``answered`` None: cancelled by us, which says nothing about the server."""
        started = self._pending.pop(token, now)
        if answered:
            self._unanswered_since = None
        elif answered is False and self._unanswered_since is None:
            self._unanswered_since = started

    def problem(self, now: float) -> str | None:
        waiting = [*self._pending.values()]
        if self._unanswered_since is not None:
            waiting.append(self._unanswered_since)
        if not waiting or now - min(waiting) < WRITE_STALL_SECONDS:
            return None
        return f"no answer from the API server to a write for {now - min(waiting):.0f}s"


class HealthServer:
    def __init__(
        self,
        port: int,
        ready: Callable[[], list[str]],
        *,
        extra: Mapping[str, Handler] | None = None,
    ) -> None:
        """``ready`` returns what keeps the controller from being ready (empty: ready);
        ``extra`` adds routes (``/metrics`` when it shares the port)."""
        self.port = port
        self._ready = ready
        self._extra = dict(extra or {})
        self._runner: web.AppRunner | None = None

    async def _healthz(self, _request: web.Request) -> web.Response:
        return web.Response(text="ok\n")

    async def _readyz(self, _request: web.Request) -> web.Response:
        problems = self._ready()
        if problems:
            return web.Response(status=503, text="".join(f"{p}\n" for p in problems))
        return web.Response(text="ok\n")

    async def start(self) -> None:
        app = web.Application()
        app.router.add_get("/healthz", self._healthz)
        app.router.add_get("/readyz", self._readyz)
        self._runner = await serve(app, self._extra, self.port)

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()


async def serve(app: web.Application, routes: Mapping[str, Handler], port: int) -> web.AppRunner:
    for path, handler in routes.items():
        app.router.add_get(path, handler)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, port=port).start()
    paths = sorted({r.resource.canonical for r in app.router.routes() if r.resource})
    log.info("serving", extra={"port": port, "paths": ",".join(paths)})
    return runner

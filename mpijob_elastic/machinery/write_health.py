"""Whether the API server answers the controller's requests: the "cannot write" of /readyz.

It lives with the machinery that makes the requests (kube.py); the health server (app)
only reads it.
"""

from __future__ import annotations

from mpijob_elastic.machinery.clients import WRITE_CONNECT_TIMEOUT_SECONDS

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

"""An asyncio work queue with client-go's semantics, for level-triggered reconcilers.

Event handlers only ``add`` keys; workers ``get`` a key, reconcile the object it names from
the informer caches, and call ``done``. Three properties make that safe and cheap:

* A key waiting in the queue is queued once however many events name it, so a burst of
  events costs one reconcile.
* A key is never handed to two workers at once: a key added while a worker holds it is
  marked dirty and queued again only when that worker calls ``done``, so the second
  reconcile sees the first one's writes.
* Failures are retried with per-key exponential backoff (``add_rate_limited``) that a
  success resets (``forget``), so one broken object neither spins nor starves the others.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)

BASE_BACKOFF_SECONDS = 0.005


class ShutDownError(Exception):
    """Raised by ``WorkQueue.get`` once the queue is shut down: the worker should exit."""


class ItemBackoff(Generic[K]):
    """Per-key exponential backoff: 5 ms after the first failure, doubling up to a cap.

    Kept apart from the queue so the arithmetic can be tested without waiting for timers.
    """

    def __init__(self, max_delay_seconds: float) -> None:
        self._max_delay = max_delay_seconds
        self._failures: dict[K, int] = {}

    def next_delay(self, key: K) -> float:
        """Record one more failure of ``key`` and return how long to wait before retrying."""
        failures = self._failures.get(key, 0)
        self._failures[key] = failures + 1
        # The exponent is bounded so a key failing for days cannot overflow the float.
        return min(self._max_delay, BASE_BACKOFF_SECONDS * 2.0 ** min(failures, 64))

    def failures(self, key: K) -> int:
        return self._failures.get(key, 0)

    def forget(self, key: K) -> None:
        self._failures.pop(key, None)


class WorkQueue(Generic[K]):
    """A deduplicating FIFO of keys with delayed and rate-limited adds.

    All methods but ``get`` are synchronous so informer event handlers can call them
    directly. Must be used from one event loop.
    """

    def __init__(
        self,
        max_backoff_seconds: float = 60.0,
        observe_wait: Callable[[float], None] | None = None,
    ) -> None:
        """``observe_wait`` is told, at each ``get``, how long the key waited since it was
        queued (for the queue-wait metric)."""
        self._queue: deque[K] = deque()
        # Keys that need processing: those waiting in _queue, plus keys added again while
        # being processed (those are not in _queue until done() puts them there).
        self._dirty: set[K] = set()
        self._processing: set[K] = set()
        self._timers: dict[K, asyncio.TimerHandle] = {}
        self._backoff: ItemBackoff[K] = ItemBackoff(max_backoff_seconds)
        self._not_empty = asyncio.Event()
        self._shutting_down = False
        self._observe_wait = observe_wait
        # Key -> time.monotonic() when it entered _queue; only kept with observe_wait.
        self._queued_at: dict[K, float] = {}

    def __len__(self) -> int:
        """The number of keys waiting to be handed out (not delayed, not in progress)."""
        return len(self._queue)

    def add(self, key: K) -> None:
        if self._shutting_down or key in self._dirty:
            return
        self._dirty.add(key)
        if key in self._processing:
            return
        self._enqueue(key)

    def _enqueue(self, key: K) -> None:
        if self._observe_wait is not None:
            self._queued_at[key] = time.monotonic()
        self._queue.append(key)
        self._not_empty.set()

    async def get(self) -> K:
        """Wait for the next key and mark it in progress; the caller must call ``done``.

        Raises ShutDownError once the queue is shut down, even if keys are still waiting:
        reconciles are level-based, so the next controller to start redoes any of them.
        """
        while True:
            if self._shutting_down:
                raise ShutDownError
            if self._queue:
                key = self._queue.popleft()
                self._dirty.discard(key)
                self._processing.add(key)
                if self._observe_wait is not None:
                    self._observe_wait(time.monotonic() - self._queued_at.pop(key))
                return key
            # Every waiter wakes on each add and all but one find the queue empty again;
            # with a handful of workers that is cheaper than tracking waiters one by one.
            self._not_empty.clear()
            await self._not_empty.wait()

    def done(self, key: K) -> None:
        """Mark ``key`` finished; if it was added meanwhile, it is queued again now."""
        self._processing.discard(key)
        if key in self._dirty and not self._shutting_down:
            self._enqueue(key)

    def add_after(self, key: K, delay_seconds: float) -> None:
        """Add ``key`` once ``delay_seconds`` have passed.

        Only the soonest pending delayed add of a key is kept: asking for a later one while a
        sooner one is pending changes nothing, and a sooner one replaces a later one.
        """
        if self._shutting_down:
            return
        if delay_seconds <= 0:
            self.add(key)
            return
        loop = asyncio.get_running_loop()
        when = loop.time() + delay_seconds
        pending = self._timers.get(key)
        if pending is not None:
            if pending.when() <= when:
                return
            pending.cancel()
        self._timers[key] = loop.call_at(when, self._fire, key)

    def _fire(self, key: K) -> None:
        del self._timers[key]
        self.add(key)

    def add_rate_limited(self, key: K) -> None:
        """Retry ``key`` after a failed reconcile, waiting longer after each failure."""
        self.add_after(key, self._backoff.next_delay(key))

    def forget(self, key: K) -> None:
        """Reset ``key``'s backoff; call it after a successful reconcile."""
        self._backoff.forget(key)

    def num_failures(self, key: K) -> int:
        """How many rate-limited adds ``key`` has had since it was last forgotten."""
        return self._backoff.failures(key)

    def shutdown(self) -> None:
        """Make every current and future ``get`` raise ShutDownError; drop pending adds."""
        self._shutting_down = True
        for timer in self._timers.values():
            timer.cancel()
        self._timers.clear()
        self._not_empty.set()

"""An asyncio work queue with client-go's semantics, for level-triggered reconcilers.

Event handlers only ``add`` keys; workers ``get`` a key, reconcile the object it names from
the informer caches, and call ``done``. Three properties make that safe and cheap:

* A key waiting in the queue is queued once however many events name it, so a burst of
  events costs one reconcile.
* A key is never handed to two workers at once: a key added while a worker holds it is
  marked dirty and queued again only when that worker calls ``done``, so the second
  reconcile sees the first one's writes.
* Failures are retried with per-key exponential backoff (``add_rate_limited``) that a
  success resets (``forget``), so one broken object neither spins nor starves the others;
  and all retries together are held to a token bucket (10 a second, bursts of 100), so
  that many objects failing at once (an API server refusing every write) cannot turn into
  a storm of retries. That is client-go's default controller rate limiter: the longer of
  the two delays. Plain adds (events, requeues) are not limited, as in client-go.

Unlike client-go's FIFO, keys come out in an order (docs/design.md, "Which job goes
next"): each add names a lane, and the lanes are served first to last. In ``FIRST`` and
``URGENT`` keys go in the order they were added (the reconciler puts there a change that
starts pods, and one that can move a job's host list); in ``RANKED`` by their ``rank``
(the reconciler's: the job's creation time), so that the follow-up turns of older jobs go
before newer jobs' turns instead of every job advancing in lock-step. Without a ``rank``
``RANKED`` is a FIFO.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import time
from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)

# The lanes, served first to last.
FIRST = 0
URGENT = 1
RANKED = 2

BASE_BACKOFF_SECONDS = 0.005
# client-go's DefaultControllerRateLimiter's bucket.
RETRIES_PER_SECOND = 10.0
RETRY_BURST = 100


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

    def forget(self, key: K) -> None:
        self._failures.pop(key, None)


class TokenBucket:
    """Retries for all keys together: ``burst`` at once, then ``rate`` a second.

    Each retry takes a token, and waits until the bucket would have refilled to it;
    tokens are taken ahead (the count goes below zero), so retries asked for in a burst
    are spread out at ``rate`` rather than all waiting for the same moment: Go's
    ``rate.Limiter.Reserve``, as client-go's BucketRateLimiter uses it.
    """

    def __init__(
        self,
        rate: float = RETRIES_PER_SECOND,
        burst: int = RETRY_BURST,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._rate = rate
        self._burst = burst
        self._clock = clock
        self._tokens = float(burst)
        self._at = clock()

    def reserve(self) -> float:
        """Take a token; return how long to wait until it is there (0: now)."""
        now = self._clock()
        self._tokens = min(self._burst, self._tokens + (now - self._at) * self._rate) - 1
        self._at = now
        return max(0.0, -self._tokens / self._rate)


class WorkQueue(Generic[K]):
    """A deduplicating priority queue of keys with delayed and rate-limited adds.

    All methods but ``get`` are synchronous so informer event handlers can call them
    directly. Must be used from one event loop. ``rank(key)`` orders the keys of
    ``RANKED``, lowest first; it is read when a key is queued.
    """

    def __init__(
        self,
        max_backoff_seconds: float = 60.0,
        rank: Callable[[K], float] | None = None,
        observe_wait: Callable[[float], None] | None = None,
    ) -> None:
        """``observe_wait`` is told, at each ``get``, how long the key waited since it was
        queued (for the queue-wait metric)."""
        # (lane, rank, sequence, key): a heap whose sequence breaks ties by arrival and
        # is never equal, so keys are never compared.
        self._heap: list[tuple[int, float, int, K]] = []
        # The sequence of each waiting key's live heap entry; an entry whose sequence is
        # not here is stale (its key moved to a sooner lane, and was pushed again) and is
        # skipped.
        self._queued: dict[K, int] = {}
        # Keys that need processing, with the soonest lane asked for: those waiting in the
        # heap, plus keys added again while being processed (not in the heap until done()).
        self._dirty: dict[K, int] = {}
        self._processing: set[K] = set()
        self._sequence = itertools.count()
        self._rank = rank
        self._timers: dict[K, asyncio.TimerHandle] = {}
        self._backoff: ItemBackoff[K] = ItemBackoff(max_backoff_seconds)
        self._bucket = TokenBucket()
        self._not_empty = asyncio.Event()
        self._shutting_down = False
        self._observe_wait = observe_wait
        # Key -> time.monotonic() when it was queued; only kept with observe_wait.
        self._queued_at: dict[K, float] = {}

    def __len__(self) -> int:
        """The number of keys waiting to be handed out (not delayed, not in progress)."""
        return len(self._queued)

    def add(self, key: K, *, lane: int = RANKED) -> None:
        """Queue ``key`` in ``lane``; an add of a key already waiting in a later lane moves
        it to the back of this one."""
        if self._shutting_down:
            return
        if key in self._dirty:
            if lane < self._dirty[key]:
                self._dirty[key] = lane
                if key in self._queued:
                    self._push(key)
            return
        self._dirty[key] = lane
        if key in self._processing:
            return
        self._push(key)

    def _push(self, key: K) -> None:
        if self._observe_wait is not None:
            # A key moved forward keeps the time it was first queued.
            self._queued_at.setdefault(key, time.monotonic())
        sequence = next(self._sequence)
        lane = self._dirty[key]
        rank = self._rank(key) if lane == RANKED and self._rank else 0.0
        entry = (lane, rank, sequence, key)
        heapq.heappush(self._heap, entry)
        self._queued[key] = sequence
        self._not_empty.set()

    async def get(self) -> K:
        """Wait for the next key and mark it in progress; the caller must call ``done``.

        Raises ShutDownError once the queue is shut down, even if keys are still waiting:
        reconciles are level-based, so the next controller to start redoes any of them.
        """
        while True:
            if self._shutting_down:
                raise ShutDownError
            while self._heap:
                _, _, sequence, key = heapq.heappop(self._heap)
                if self._queued.get(key) != sequence:
                    continue
                del self._queued[key]
                del self._dirty[key]
                self._processing.add(key)
                if self._observe_wait is not None:
                    self._observe_wait(time.monotonic() - self._queued_at.pop(key))
                return key
            # Every waiter wakes on each add and all but one find the queue empty again;
            # with a few dozen workers that is cheaper than tracking waiters one by one.
            self._not_empty.clear()
            await self._not_empty.wait()

    def done(self, key: K) -> None:
        """Mark ``key`` finished; if it was added meanwhile, it is queued again now."""
        self._processing.discard(key)
        if key in self._dirty and not self._shutting_down:
            self._push(key)

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
        """Retry ``key`` after a failed reconcile, waiting longer after each failure, and
        as long as the retries of all keys together call for."""
        self.add_after(key, max(self._backoff.next_delay(key), self._bucket.reserve()))

    def forget(self, key: K) -> None:
        """Reset ``key``'s backoff; call it after a successful reconcile."""
        self._backoff.forget(key)

    def shutdown(self) -> None:
        """Make every current and future ``get`` raise ShutDownError; drop pending adds."""
        self._shutting_down = True
        for timer in self._timers.values():
            timer.cancel()
        self._timers.clear()
        self._not_empty.set()

"""WorkQueue semantics: dedup, one worker per key, delays, backoff and shutdown."""

from __future__ import annotations

import asyncio
import time

import pytest

from mpijob_elastic.machinery.workqueue import (
    BASE_BACKOFF_SECONDS,
    FIRST,
    RETRIES_PER_SECOND,
    RETRY_BURST,
    URGENT,
    ItemBackoff,
    ShutDownError,
    TokenBucket,
    WorkQueue,
)

Key = tuple[str, str]
A: Key = ("ns", "a")
B: Key = ("ns", "b")
C: Key = ("ns", "c")

# Long enough for a scheduled timer or a woken task to run, far below a second.
SHORT = 0.2


async def get_soon(queue: WorkQueue[Key]) -> Key:
    return await asyncio.wait_for(queue.get(), SHORT)


async def assert_nothing_ready(queue: WorkQueue[Key], wait: float = 0.05) -> None:
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(queue.get(), wait)


async def test_add_dedups_waiting_keys_and_keeps_fifo_order() -> None:
    queue: WorkQueue[Key] = WorkQueue()
    for key in (A, B, A, C, B):
        queue.add(key)
    assert len(queue) == 3
    assert [await get_soon(queue) for _ in range(3)] == [A, B, C]
    assert len(queue) == 0


async def test_key_added_while_processing_waits_for_done() -> None:
    queue: WorkQueue[Key] = WorkQueue()
    queue.add(A)
    assert await get_soon(queue) == A
    queue.add(A)
    queue.add(A)
    # A second worker must not get A while the first one holds it.
    assert len(queue) == 0
    await assert_nothing_ready(queue)
    queue.done(A)
    assert len(queue) == 1
    assert await get_soon(queue) == A
    queue.done(A)
    # Added twice while processing, but queued again only once.
    await assert_nothing_ready(queue)


async def test_done_without_re_add_does_not_requeue() -> None:
    queue: WorkQueue[Key] = WorkQueue()
    queue.add(A)
    await get_soon(queue)
    queue.done(A)
    assert len(queue) == 0


async def test_concurrent_workers_never_share_a_key() -> None:
    # Gates, not sleeps: which adds land while a key is held must not depend on how fast
    # a loaded machine runs the workers.
    queue: WorkQueue[Key] = WorkQueue()
    in_progress: set[Key] = set()
    overlaps: list[Key] = []
    processed: list[Key] = []
    release, all_held, all_done = asyncio.Event(), asyncio.Event(), asyncio.Event()

    async def worker() -> None:
        while True:
            try:
                key = await queue.get()
            except ShutDownError:
                return
            if key in in_progress:
                overlaps.append(key)
            in_progress.add(key)
            if in_progress == {A, B, C}:
                all_held.set()
            await release.wait()
            processed.append(key)
            in_progress.discard(key)
            queue.done(key)
            if len(processed) == 6 and not in_progress:
                all_done.set()

    workers = [asyncio.create_task(worker()) for _ in range(4)]
    for key in (A, B, C):
        queue.add(key)
    await asyncio.wait_for(all_held.wait(), SHORT)
    for _ in range(5):
        for key in (A, B, C):
            queue.add(key)
    # The fourth worker is idle, and still gets none of the held keys.
    await assert_nothing_ready(queue)
    assert in_progress == {A, B, C}
    release.set()
    await asyncio.wait_for(all_done.wait(), SHORT)
    queue.shutdown()
    await asyncio.wait_for(asyncio.gather(*workers), SHORT)
    assert overlaps == []
    # Dedup: 18 adds, each key reconciled once, then once more for the adds it missed.
    assert sorted(processed) == sorted([A, B, C] * 2)


async def test_waiting_worker_wakes_on_add() -> None:
    queue: WorkQueue[Key] = WorkQueue()
    getter = asyncio.create_task(queue.get())
    await asyncio.sleep(0)
    assert not getter.done()
    queue.add(B)
    assert await asyncio.wait_for(getter, SHORT) == B


D: Key = ("ns", "d")
# Lower comes first: in the controller, the job's creation time.
RANKS = {A: 3.0, B: 1.0, C: 2.0, D: 0.0}


async def test_keys_come_out_by_rank_not_by_arrival() -> None:
    queue: WorkQueue[Key] = WorkQueue(rank=RANKS.__getitem__)
    for key in (A, B, C):
        queue.add(key)
    assert [await get_soon(queue) for _ in range(3)] == [B, C, A]


async def test_urgent_keys_go_first_in_arrival_order() -> None:
    queue: WorkQueue[Key] = WorkQueue(rank=RANKS.__getitem__)
    queue.add(D)
    queue.add(A, lane=URGENT)
    queue.add(C)
    queue.add(B, lane=URGENT)
    assert [await get_soon(queue) for _ in range(4)] == [A, B, D, C]


async def test_the_first_lane_goes_before_the_urgent_one() -> None:
    queue: WorkQueue[Key] = WorkQueue(rank=RANKS.__getitem__)
    queue.add(D)
    queue.add(A, lane=URGENT)
    queue.add(C, lane=FIRST)
    queue.add(B, lane=FIRST)
    assert [await get_soon(queue) for _ in range(4)] == [C, B, A, D]


async def test_a_key_moves_only_to_a_sooner_lane() -> None:
    queue: WorkQueue[Key] = WorkQueue(rank=RANKS.__getitem__)
    queue.add(A, lane=URGENT)
    queue.add(B, lane=URGENT)
    queue.add(B, lane=FIRST)  # to the front
    queue.add(B, lane=URGENT)  # not back
    assert [await get_soon(queue) for _ in range(2)] == [B, A]


async def test_an_urgent_add_moves_a_waiting_key_forward_once() -> None:
    queue: WorkQueue[Key] = WorkQueue(rank=RANKS.__getitem__)
    queue.add(D)
    queue.add(A)
    queue.add(A, lane=URGENT)
    queue.add(A)  # a later lane: leaves it urgent
    assert len(queue) == 2
    assert await get_soon(queue) == A
    assert await get_soon(queue) == D
    # The entry A left behind when it moved is not handed out again.
    queue.done(A)
    queue.done(D)
    await assert_nothing_ready(queue)
    assert len(queue) == 0


async def test_urgency_added_while_processing_survives_the_requeue() -> None:
    queue: WorkQueue[Key] = WorkQueue(rank=RANKS.__getitem__)
    queue.add(A)
    assert await get_soon(queue) == A
    queue.add(A)
    queue.add(A, lane=URGENT)
    queue.add(D)
    # One worker per key still: A waits for done() even though it is urgent now.
    assert await get_soon(queue) == D
    await assert_nothing_ready(queue)
    queue.add(C)
    queue.done(A)
    assert [await get_soon(queue) for _ in range(2)] == [A, C]


async def test_rank_is_read_when_the_key_is_queued() -> None:
    ranks = dict(RANKS)
    queue: WorkQueue[Key] = WorkQueue(rank=ranks.__getitem__)
    queue.add(A)
    assert await get_soon(queue) == A
    queue.done(A)
    ranks[A] = -1.0  # an older job than any, say once its creation time is known
    queue.add(B)
    queue.add(A)
    assert [await get_soon(queue) for _ in range(2)] == [A, B]


async def test_add_after_delivers_in_due_order() -> None:
    queue: WorkQueue[Key] = WorkQueue()
    queue.add_after(A, 0.06)
    queue.add_after(B, 0.02)
    queue.add_after(C, 0)  # no delay: added at once
    assert len(queue) == 1
    assert await get_soon(queue) == C
    assert await get_soon(queue) == B
    assert await get_soon(queue) == A


async def test_add_after_keeps_the_sooner_pending_add() -> None:
    queue: WorkQueue[Key] = WorkQueue()
    queue.add_after(A, 0.02)
    queue.add_after(A, 10)  # later: ignored
    assert await get_soon(queue) == A
    queue.done(A)
    queue.add_after(B, 10)
    queue.add_after(B, 0.02)  # sooner: replaces the 10 s one
    assert await get_soon(queue) == B
    queue.done(B)
    # Each key fired exactly once.
    await assert_nothing_ready(queue)


def test_backoff_doubles_from_5ms_and_is_capped() -> None:
    backoff: ItemBackoff[Key] = ItemBackoff(max_delay_seconds=0.1)
    delays = [backoff.next_delay(A) for _ in range(7)]
    assert delays == pytest.approx([0.005, 0.01, 0.02, 0.04, 0.08, 0.1, 0.1])
    # Keys back off independently.
    assert backoff.next_delay(B) == pytest.approx(0.005)
    backoff.forget(A)
    assert backoff.next_delay(A) == pytest.approx(0.005)


def test_backoff_survives_very_many_failures() -> None:
    backoff: ItemBackoff[Key] = ItemBackoff(max_delay_seconds=60)
    for _ in range(5000):
        delay = backoff.next_delay(A)
    assert delay == 60


async def test_add_rate_limited_backs_off_until_forget() -> None:
    queue: WorkQueue[Key] = WorkQueue(max_backoff_seconds=10)
    queue.add_rate_limited(A)  # first failure: 5 ms
    assert await get_soon(queue) == A
    for _ in range(20):
        queue.add_rate_limited(A)  # still failing: delays pile up to the 10 s cap
    queue.done(A)
    # The 10 ms retry scheduled by the second failure is the sooner one and is kept.
    assert await get_soon(queue) == A
    queue.done(A)
    queue.add_rate_limited(A)  # 22nd failure: 10 s, capped
    await assert_nothing_ready(queue)
    queue.forget(A)
    queue.add_rate_limited(A)  # back to 5 ms, which replaces the pending 10 s retry
    assert await get_soon(queue) == A


async def test_shutdown_releases_waiting_and_future_getters() -> None:
    queue: WorkQueue[Key] = WorkQueue()
    getters = [asyncio.create_task(queue.get()) for _ in range(3)]
    await asyncio.sleep(0)
    queue.add_after(A, 0.01)
    queue.shutdown()
    for getter in getters:
        with pytest.raises(ShutDownError):
            await asyncio.wait_for(getter, SHORT)
    # Later adds are dropped and later gets fail at once, also with keys left waiting.
    queue.add(B)
    assert len(queue) == 0
    with pytest.raises(ShutDownError):
        await get_soon(queue)
    await asyncio.sleep(0.02)
    assert len(queue) == 0


async def test_shutdown_stops_workers_even_with_keys_waiting() -> None:
    queue: WorkQueue[Key] = WorkQueue()
    queue.add(A)
    queue.add(B)
    queue.shutdown()
    with pytest.raises(ShutDownError):
        await get_soon(queue)


async def test_a_key_moved_forward_keeps_the_time_it_was_first_queued() -> None:
    waits: list[float] = []
    queue: WorkQueue[Key] = WorkQueue(observe_wait=waits.append)
    queue.add(A)
    await asyncio.sleep(0.02)
    queue.add(A, lane=URGENT)
    assert await get_soon(queue) == A
    assert len(waits) == 1
    assert waits[0] >= 0.02


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_the_bucket_lets_a_burst_through_then_spreads_retries_at_its_rate() -> None:
    clock = FakeClock()
    bucket = TokenBucket(rate=10, burst=100, clock=clock)
    assert [bucket.reserve() for _ in range(100)] == [0.0] * 100
    # Tokens are taken ahead: each further retry waits a tenth of a second more.
    assert [bucket.reserve() for _ in range(3)] == pytest.approx([0.1, 0.2, 0.3])
    clock.now += 0.3  # the three reserved tokens have come in
    assert bucket.reserve() == pytest.approx(0.1)
    clock.now += 60  # refilled, but never above the burst
    assert [bucket.reserve() for _ in range(100)] == [0.0] * 100
    assert bucket.reserve() == pytest.approx(0.1)


async def test_retries_of_many_keys_are_held_to_the_overall_rate() -> None:
    """Past the burst, a key's first retry waits for the bucket, not its own 5 ms."""
    queue: WorkQueue[Key] = WorkQueue()
    keys: list[Key] = [("ns", str(i)) for i in range(RETRY_BURST + 1)]
    started = time.monotonic()
    for key in keys:
        queue.add_rate_limited(key)
    got = {await get_soon(queue) for _ in range(RETRY_BURST)}
    assert got == set(keys[:RETRY_BURST])
    # The 101st waits for the bucket's next token. Measured from the adds, not as "nothing
    # ready yet" after the first 100 were read: on a loaded machine that read alone has
    # taken longer than the token's 0.1 s.
    assert await asyncio.wait_for(queue.get(), 5) == keys[-1]
    assert time.monotonic() - started >= 1 / RETRIES_PER_SECOND > BASE_BACKOFF_SECONDS


async def test_plain_adds_are_not_limited() -> None:
    queue: WorkQueue[Key] = WorkQueue()
    for i in range(RETRY_BURST):
        queue.add_rate_limited(("ns", f"r{i}"))
    for _ in range(RETRY_BURST):
        queue.done(await get_soon(queue))
    queue.add(A)  # the bucket is empty, an event's add is not held
    assert await get_soon(queue) == A

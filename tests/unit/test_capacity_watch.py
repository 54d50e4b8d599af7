"""The spacing of capacity wakes (machinery/capacity_watch.py) and the watch stream's
framing (machinery/watch_stream.py); the watch itself against the API server:
tests/integration/test_capacity_watch.py."""

from __future__ import annotations

import asyncio
import json

import aiohttp
from aiohttp.base_protocol import BaseProtocol

from mpijob_elastic.machinery import watch_stream
from mpijob_elastic.machinery.capacity_watch import Spacer


async def test_wakes_gather_a_burst_are_spaced_and_the_last_is_deferred_not_dropped() -> None:
    fired: list[float] = []
    loop = asyncio.get_running_loop()
    spacer = Spacer(lambda: fired.append(loop.time()), 0.6, 0.1)
    start = loop.time()
    spacer()
    spacer()  # the same burst
    assert fired == []
    await asyncio.sleep(0.2)
    assert len(fired) == 1  # one wake for the burst, once it settled
    assert fired[0] - start >= 0.09
    spacer()
    spacer()  # within the period: one deferred call for both
    await asyncio.sleep(0.2)
    assert len(fired) == 1
    await asyncio.sleep(0.4)
    assert len(fired) == 2
    assert fired[1] - fired[0] >= 0.59
    await asyncio.sleep(0.7)
    spacer()  # a quiet period has passed: after the settle only
    await asyncio.sleep(0.2)
    assert len(fired) == 3


async def test_cancel_drops_the_deferred_wake() -> None:
    fired: list[int] = []
    spacer = Spacer(lambda: fired.append(1), 0.2, 0.05)
    spacer()
    await asyncio.sleep(0.1)
    spacer()
    spacer.cancel()
    await asyncio.sleep(0.3)
    assert fired == [1]


async def test_events_are_split_at_newlines_across_chunks() -> None:
    loop = asyncio.get_running_loop()
    protocol = BaseProtocol(loop)
    stream = aiohttp.StreamReader(protocol, 2**16, loop=loop)
    stream.feed_data(b'{"type": "ADDED"}\n{"type": "DEL')
    stream.feed_data(b'ETED"}\n\n{"type": "BOOKMARK"}\n')
    stream.feed_eof()
    events = [json.loads(line) async for line in watch_stream.lines(stream)]
    assert [e["type"] for e in events] == ["ADDED", "DELETED", "BOOKMARK"]

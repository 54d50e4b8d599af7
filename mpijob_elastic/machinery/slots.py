"""A writer lane's slots (write_order.py, ``Step.ahead``): a semaphore whose waiters marked
``ahead`` take a freed slot before the others, each kind in the order it came."""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import AsyncIterator


class Slots:
    def __init__(self, count: int) -> None:
        self._free = count
        self._waiting: dict[bool, deque[asyncio.Future[None]]] = {True: deque(), False: deque()}

    @contextlib.asynccontextmanager
    async def slot(self, *, ahead: bool = False) -> AsyncIterator[None]:
        if self._free and not any(self._waiting.values()):
            self._free -= 1
        else:
            granted: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            self._waiting[ahead].append(granted)
            try:
                await granted
            except asyncio.CancelledError:
                if granted.done() and not granted.cancelled():
                    self._release()  # handed a slot as it was cancelled: pass it on
                raise
        try:
            yield
        finally:
            self._release()

    def _release(self) -> None:
        for kind in (True, False):
            queue = self._waiting[kind]
            while queue:
                waiter = queue.popleft()
                if not waiter.done():  # a cancelled waiter is skipped
                    waiter.set_result(None)
                    return
        self._free += 1

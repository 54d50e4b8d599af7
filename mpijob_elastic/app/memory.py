"""Giving the memory of a past peak back to the system.

CPython takes every object over 512 bytes (dict tables of cached objects, lists, the
bytes of an API response or of a launcher's process list) from glibc's malloc, and glibc
hands freed memory back to the system only when it lies at the top of a heap. Whatever a
peak left in the middle (a relist after a restart, a burst of launcher reads, a mass
rescale) stays in the process's RSS for good, although nothing uses it. ``malloc_trim(0)``
walks every arena and returns each free page (``MADV_DONTNEED``); it costs a few
milliseconds and changes nothing the program sees, so it runs once a minute. Libraries
other than glibc (musl) have no ``malloc_trim``: there this does nothing.
"""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
from collections.abc import Callable

# Often enough that a peak's memory is back within a minute, rarely enough to cost nothing.
TRIM_SECONDS = 60.0


def _malloc_trim() -> Callable[[int], int] | None:
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    trim = getattr(ctypes.CDLL(name), "malloc_trim", None)
    if trim is None:
        return None
    trim.argtypes = [ctypes.c_size_t]
    trim.restype = ctypes.c_int
    return trim  # type: ignore[no-any-return]


_TRIM = _malloc_trim()


def release() -> bool:
    """Return the allocator's free pages to the system; whether any were."""
    return bool(_TRIM(0)) if _TRIM is not None else False


async def release_periodically() -> None:
    """``release`` every TRIM_SECONDS until cancelled."""
    while True:
        await asyncio.sleep(TRIM_SECONDS)
        release()

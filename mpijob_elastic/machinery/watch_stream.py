"""The framing of a Kubernetes watch stream: newline-terminated JSON events, one object
each. Shared by the informers (informer.py) and the capacity watch (capacity_watch.py)."""

from __future__ import annotations

from collections.abc import AsyncGenerator

import aiohttp


async def lines(stream: aiohttp.StreamReader) -> AsyncGenerator[bytes, None]:
    """Split a watch stream into its newline-terminated JSON events, however large.

    aiohttp's readline refuses lines longer than its buffer limit, and one event holds a
    whole object, which can be megabytes.
    """
    buffer = bytearray()
    async for chunk in stream.iter_any():
        scanned = len(buffer)
        buffer += chunk
        start = 0
        while (end := buffer.find(b"\n", scanned)) >= 0:
            line = bytes(buffer[start:end])
            if line.strip():
                yield line
            start = scanned = end + 1
        del buffer[:start]
    if bytes(buffer).strip():
        raise ValueError("watch stream ended in the middle of an event")

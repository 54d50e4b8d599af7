"""app/stacks.py: a task's chain of awaits, outermost first."""

from __future__ import annotations

import asyncio
import contextlib

from mpijob_elastic.app import stacks


async def _inner(gate: asyncio.Event) -> None:
    await gate.wait()


async def _outer(gate: asyncio.Event) -> None:
    await _inner(gate)


def test_a_suspended_task_shows_every_coroutine_it_waits_in() -> None:
    async def run() -> list[str]:
        gate = asyncio.Event()
        task = asyncio.create_task(_outer(gate))
        await asyncio.sleep(0)
        chain = stacks.awaits(task.get_coro())
        gate.set()
        await task
        return chain

    chain = asyncio.run(run())
    functions = [where.rsplit(" ", 1)[1] for where in chain]
    assert functions[:3] == ["_outer", "_inner", "wait"], chain
    assert chain[0].startswith(__file__), chain


def test_a_finished_coroutine_has_no_awaits() -> None:
    async def done() -> None:
        return None

    coro = done()
    with contextlib.suppress(StopIteration):
        coro.send(None)
    assert stacks.awaits(coro) == []

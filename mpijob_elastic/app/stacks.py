"""Where a controller that seems stuck is waiting (docs/operations.md, "A controller that
seems stuck").

``SIGUSR1`` writes every thread's Python stack to stderr (faulthandler): it is written
from the signal handler itself, so it answers even when the event loop is stuck in a
computation. ``SIGUSR2`` logs, at WARNING, every asyncio task with the chain of awaits it
is suspended in: where a turn waits that never ends. A thread dump cannot say that, as
every task waits in the same ``select``.
"""

from __future__ import annotations

import asyncio
import faulthandler
import logging
import signal
from typing import Any

log = logging.getLogger("mpijob_elastic.app.stacks")

STDERR = 2


def install(loop: asyncio.AbstractEventLoop) -> None:
    # The descriptor, not sys.stderr: the handler writes from C, to the process's stderr,
    # whatever Python's stream object is at the time (a test's capture has no descriptor).
    faulthandler.register(signal.SIGUSR1, file=STDERR, all_threads=True)
    loop.add_signal_handler(signal.SIGUSR2, log_tasks)


def log_tasks() -> None:
    for task in asyncio.all_tasks():
        log.warning("task", extra={"task": task.get_name(), "awaits": awaits(task.get_coro())})


def awaits(coro: Any) -> list[str]:
    """``file:line function`` of each coroutine in the chain ``coro`` is suspended in,
    outermost first (``Task.get_stack`` gives only the outermost of a suspended task)."""
    chain = []
    while coro is not None:
        frame = getattr(coro, "cr_frame", None) or getattr(coro, "gi_frame", None)
        if frame is None:
            break
        chain.append(f"{frame.f_code.co_filename}:{frame.f_lineno} {frame.f_code.co_name}")
        coro = getattr(coro, "cr_await", None) or getattr(coro, "gi_yieldfrom", None)
    return chain

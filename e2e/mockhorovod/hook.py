"""The training's commit hook, as a real training uses it: ``contrib/mpijob_elastic_notice.py``.

The mock rank prints the commit marker the way a training with the hook does: it wraps a
Horovod-like state object with ``report_commits`` and calls its ``commit()``. The file is a
standalone script that training images copy, not a package, so it is loaded by path: from
the checkout (``<repo>/contrib``), or from the mock images, which copy it to the same place
next to ``e2e/`` (``/opt/mockhorovod/contrib``, e2e/images/*/Dockerfile).
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Final

HOOK_FILE: Final = Path(__file__).resolve().parents[2] / "contrib" / "mpijob_elastic_notice.py"


def _load() -> ModuleType:
    spec = importlib.util.spec_from_file_location("mpijob_elastic_notice", HOOK_FILE)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load the commit hook from {HOOK_FILE}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


_hook = _load()

# The line the hook prints at the first commit after a reset (what kubexec.sh watches for).
COMMITTED_MARKER: Final[str] = str(_hook.COMMITTED_MARKER)


class TrainingState:
    """The smallest ``hvd.elastic.State`` the hook can wrap: a ``commit()`` (nothing to save
    here) and ``register_reset_callbacks``; ``reset()`` is what Horovod does to the state
    when a reset ends (``State.on_reset``): it runs the callbacks."""

    def __init__(self) -> None:
        self._callbacks: list[Callable[[], None]] = []

    def register_reset_callbacks(self, callbacks: list[Callable[[], None]]) -> None:
        self._callbacks.extend(callbacks)

    def commit(self) -> None:
        """``state.commit()``: saves and checks for host updates; the hook wraps it."""

    def reset(self) -> None:
        for callback in self._callbacks:
            callback()


def reporting_state() -> TrainingState:
    """A state wrapped with the hook's ``report_commits``, printing on stdout."""
    state = TrainingState()
    _hook.report_commits(state)
    return state

"""Read the mpijob-elastic controller's notice to this pod, from a training script.

Copy this one file into a training image (the Python standard library only, 3.8+). The
controller puts its current notice for the pod in the annotation
``mpijob-elastic.io/notice``, which the pod's main container sees as the file named by
``$MPIJOB_ELASTIC_NOTICE_FILE`` (``/etc/mpijob-elastic/notice``; the kubelet rewrites it
when the annotation changes). The file is empty when there is no notice, else one line::

    <kind> <deadline, RFC 3339> <cause> <message>

``kind`` is ``job-stopping`` (the whole run stops at the deadline: a suspension below the
minimum, runPolicy.suspend, the launcher's node going, the active deadline) or
``worker-leaving`` (this worker goes; Horovod's in-memory state survives that, other ranks
keep it). docs/formats.md has the causes.

    import mpijob_elastic_notice as notice

    @hvd.elastic.run
    def train(state):
        for state.batch in range(state.batch, batches):
            step()
            if state.batch % commit_every == 0:
                state.commit()
                if hvd.rank() == 0 and notice.should_checkpoint():
                    save(state)  # to a volume the next launcher reads

It also tells the controller when Horovod's reset has ended, so that it changes the host
list again (a relocation, a drain) as soon as new ranks have joined, not after a bound of
Horovod's Gloo timeout (docs/membership.md)::

    state = hvd.elastic.TorchState(model, optimizer, batch=0)
    notice.report_commits(state)
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Callable
from datetime import datetime, timezone
from typing import Any, NamedTuple, TextIO

ENV = "MPIJOB_ELASTIC_NOTICE_FILE"
DEFAULT_PATH = "/etc/mpijob-elastic/notice"
JOB_STOPPING = "job-stopping"
# Not datetime.UTC: that is Python 3.11+, and training images often run older ones.
UTC = timezone.utc  # noqa: UP017
WORKER_LEAVING = "worker-leaving"
# The line a rank prints at its first commit after a reset. The launcher's kubexec.sh
# watches each remote shell's output for it and reports it, so the controller knows the
# reset that rank joined has ended (Horovod drops host changes made during a reset).
COMMITTED_MARKER = "mpijob-elastic: committed after reset"


class Notice(NamedTuple):
    kind: str
    deadline: datetime
    cause: str
    message: str

    @property
    def job_stopping(self) -> bool:
        return self.kind == JOB_STOPPING


def _path(path: str | None) -> str:
    return path or os.environ.get(ENV) or DEFAULT_PATH


def parse(text: str) -> Notice | None:
    """The notice a file's text holds; None if it is empty or unreadable."""
    parts = text.strip().split(" ", 3)
    if len(parts) < 3:
        return None
    try:
        deadline = datetime.strptime(parts[1], "%Y-%m-%dT%H:%M:%SZ")
    except ValueError:
        return None
    message = parts[3] if len(parts) == 4 else ""
    return Notice(parts[0], deadline.replace(tzinfo=UTC), parts[2], message)


def read_notice(path: str | None = None) -> Notice | None:
    """The pod's current notice; None when there is none, or no notice file (a pod the
    controller made before it gave notices, or a container it did not mount it in)."""
    try:
        with open(_path(path), encoding="utf-8") as f:
            return parse(f.read())
    except OSError:
        return None


def should_checkpoint(path: str | None = None) -> bool:
    """Whether the whole run is about to stop: save a checkpoint to disk now (rank 0).
    False when there is no notice, or only this worker is leaving."""
    found = read_notice(path)
    return found is not None and found.job_stopping


def time_left(path: str | None = None, now: datetime | None = None) -> float | None:
    """Seconds until the notice's deadline (0 once past it); None without a notice."""
    found = read_notice(path)
    if found is None:
        return None
    now = now or datetime.now(UTC)
    return max((found.deadline - now).total_seconds(), 0.0)


def on_job_stopping(
    save: Callable[[Notice], object], path: str | None = None, every: float = 1.0
) -> threading.Thread:
    """Call ``save(notice)`` from a daemon thread once for each job-stopping notice that
    appears (a notice removed and posted again is a new one). For rank 0: below the
    minimum, Horovod holds the ranks in a reset (no commits) until hosts return, so a
    check after ``state.commit()`` would not run before the suspension."""

    def watch() -> None:
        done = None
        while True:
            found = read_notice(path)
            if found is not None and found.job_stopping and found != done:
                done = found
                save(found)
            elif found is None or not found.job_stopping:
                done = None
            time.sleep(every)

    thread = threading.Thread(target=watch, name="mpijob-elastic-notice", daemon=True)
    thread.start()
    return thread


def report_commits(state: Any, out: TextIO | None = None) -> None:
    """Make ``state`` (a ``hvd.elastic.State``) print ``COMMITTED_MARKER`` at the first
    ``state.commit()`` that returns after each reset, and at the first of the process (a
    new rank's first commit follows the reset it joined: its ``hvd.init`` returned only
    once every rank of the new world had). A commit that raises (hosts updated: another
    reset follows) prints nothing. Every rank may call it; it costs one line per reset."""
    pending = [True]

    def on_reset() -> None:
        pending[0] = True

    state.register_reset_callbacks([on_reset])
    commit = state.commit

    def commit_and_report() -> None:
        commit()
        if pending[0]:
            pending[0] = False
            print(COMMITTED_MARKER, file=out or sys.stdout, flush=True)

    state.commit = commit_and_report


def main() -> int:
    """``python3 mpijob_elastic_notice.py``: prints the notice; exit 0 if the job is
    stopping (checkpoint now), 1 otherwise; for shell scripts."""
    found = read_notice()
    if found is not None:
        print(f"{found.kind} {found.cause} in {time_left():.0f}s: {found.message}")
    return 0 if found is not None and found.job_stopping else 1


if __name__ == "__main__":
    sys.exit(main())

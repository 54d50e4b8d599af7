"""The ranks and the current assignment as the driver's state sees them: which slot of
which host each rank holds, and what the driver knows of it. No process here: the shell
(driver.py) keeps each rank's process next to it."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(eq=False)
class Rank:
    """One slot's rank, from its start by the driver to its exit."""

    host: str
    local_rank: int
    rank_id: str
    # It printed its start line: hvd.init returned, it has joined.
    running: bool = False
    # Why the rank lost its assignment (``host_removed``, ``blacklisted``, ``slots_reduced``,
    # ``shutdown``); None while it holds one. Any exit after that is ignored, as in Horovod.
    stopping: str | None = None
    notified: bool = False
    # Its FAILURE was recorded by the driver itself (it timed out in a reset's rendezvous);
    # the exit that follows when the job is stopped says nothing more.
    aborted: bool = False
    # The reset (its commit number; 0: the job's start) that started it.
    reset: int = 0
    # The commit at which the driver asked it for the commit marker (None: not yet).
    marker_commit: int | None = None
    # The local remote shell's exit code, once it exited.
    exit_code: int | None = None

    @property
    def alive(self) -> bool:
        return self.exit_code is None


@dataclass(eq=False)
class HostEntry:
    """A host of the current assignment and its assigned ranks by local rank (a rank that
    failed stays here until the reset that follows); ``noticed_gone`` says that discovery no
    longer lists it (the ranks keep their assignment until the next reset). Unassigned
    ranks leave the entry for the driver's departing set, so a name listed again gets slots
    of its own at once, as in Horovod, which judges every exit by (host, slot)."""

    ranks: dict[int, Rank] = field(default_factory=dict)
    noticed_gone: bool = False

"""What the driver's state core (elastic.py) asks of the process shell (driver.py): the
event lines and notes to write, and what to do to the ranks' processes and files. The core
hands them over one at a time and the shell carries each out before the core goes on, so the
lines and the actions keep the order the core decided them in, which is the order the e2e
suite reads them in (a ``rank_unassigned`` before the rank can see its removal mark)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from e2e.mockhorovod.world import Rank


@dataclass(frozen=True)
class Emit:
    """One event line (events.py); the shell stamps its ``ts``."""

    event: str
    fields: dict[str, Any]


@dataclass(frozen=True)
class Note:
    """A line of the driver's own on stderr (Horovod's log lines among them)."""

    text: str


@dataclass(frozen=True)
class Probe:
    """Run the interface probe on every host through the remote shell, within
    ``remaining`` seconds, and report back (``ElasticDriver.probe_finished``)."""

    hosts: tuple[str, ...]
    remaining: float


@dataclass(frozen=True)
class StartRank:
    """Spawn the rank's remote shell; report its output and exit back to the core."""

    rank: Rank


@dataclass(frozen=True)
class WriteStopFile:
    """Write the rank's local stop file: the removal mark, or empty for the job's end."""

    rank: Rank
    content: str


@dataclass(frozen=True)
class Notify:
    """Horovod's hosts-updated notice to a rank: remove its alive file where it runs."""

    rank: Rank


@dataclass(frozen=True)
class AskMarker:
    """Tell a rank a commit returned after its reset: remove its reset file where it runs."""

    rank: Rank


@dataclass(frozen=True)
class SignalRank:
    """SIGTERM the rank's remote shell after ``delay`` seconds, SIGKILL after
    ``--stop-grace`` more; nothing when its process is not spawned yet (the shell signals
    it as soon as it is, seeing the rank has no assignment)."""

    rank: Rank
    delay: float


@dataclass(frozen=True)
class StopJob:
    """The job is ending: stop waiting for discovery and the commit clock."""


Effect = Emit | Note | Probe | StartRank | WriteStopFile | Notify | AskMarker | SignalRank | StopJob

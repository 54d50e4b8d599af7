"""What each rank's exit was, and what the next commit must do about it: Horovod's
``WorkerStateRegistry`` (runner/elastic/registration.py). An exit is recorded at once and
acted on at the barrier: a FAILURE blacklists its host, a SUCCESS ends the job."""

from __future__ import annotations

import enum

from e2e.mockhorovod.world import Rank


class Verdict(enum.Enum):
    IGNORED = "ignored"
    SUCCESS = "success"
    FAILURE = "failure"


def judge_exit(
    rank: Rank, slot_assigned: bool, job_stopping: bool, code: int
) -> tuple[Verdict, bool]:
    """The verdict on a rank's exit with ``code``, and whether it counts as the exit of a
    slot its host name was assigned again (rule 8).

    Horovod judges an exit by (host, slot) at exit time: a rank without an assignment whose
    host name holds that slot again (``slot_assigned``) counts as that slot's exit, unless
    the job is ending. Any other exit without an assignment is ignored, whatever its code (a
    removed rank aborts with 134): never a failure, never a blacklist.
    """
    reused = rank.stopping not in (None, "shutdown") and slot_assigned and not job_stopping
    if rank.stopping is not None and not reused:
        return Verdict.IGNORED, reused
    return (Verdict.SUCCESS if code == 0 else Verdict.FAILURE), reused


class WorkerStates:
    """The FAILUREs and SUCCESSes recorded since the last commit that acted on them."""

    def __init__(self) -> None:
        # Failed host -> ids of the ranks that failed there, in the order they failed.
        self._failures: dict[str, list[str]] = {}
        self.successes: list[str] = []

    def record_failure(self, rank: Rank) -> None:
        self._failures.setdefault(rank.host, []).append(rank.rank_id)

    def record_success(self, rank: Rank) -> None:
        self.successes.append(rank.rank_id)

    @property
    def any_failure(self) -> bool:
        return bool(self._failures)

    def host_failed(self, host: str) -> bool:
        return host in self._failures

    def rank_failed(self, rank: Rank) -> bool:
        return any(rank.rank_id in ids for ids in self._failures.values())

    def take_failures(self) -> dict[str, list[str]]:
        """The failures to blacklist at this commit; none are left recorded."""
        failures, self._failures = self._failures, {}
        return failures

    def all_failed(self, world: list[Rank]) -> bool:
        """Every rank of the world has a FAILURE (recorded here, or its Gloo abort)."""
        return bool(world) and all(r.aborted or self.rank_failed(r) for r in world)

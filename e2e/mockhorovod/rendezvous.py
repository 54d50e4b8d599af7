"""A reset's rendezvous window (rules 2 and 3): from the reset until every rank it started
has joined. Until then the ranks do not commit; a host update sent meanwhile is dropped
when they replace their message queue; past the Gloo timeout every rank aborts."""

from __future__ import annotations

from dataclasses import dataclass

from e2e.mockhorovod.world import Rank


@dataclass(eq=False)
class ResetWindow:
    commit: int
    started: float
    deadline: float
    new_ranks: list[Rank]

    @classmethod
    def open(
        cls, commit: int, new_ranks: list[Rank], now: float, gloo_timeout: float
    ) -> ResetWindow:
        return cls(commit=commit, started=now, deadline=now + gloo_timeout, new_ranks=new_ranks)

    def expired(self, now: float) -> bool:
        return now >= self.deadline

    def all_joined(self) -> bool:
        return all(r.running for r in self.new_ranks)

    def missing(self) -> list[str]:
        return [r.rank_id for r in self.new_ranks if not r.running]

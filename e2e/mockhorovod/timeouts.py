"""``--elastic-timeout``: how long the job may wait for slots, before its start (for ``-np``
slots and enough hosts) and while it runs (for ``--min-np`` slots), before it fails."""

from __future__ import annotations

from dataclasses import dataclass, field

from e2e.mockhorovod import events as ev
from e2e.mockhorovod.effects import Emit


@dataclass
class SlotCheck:
    """The events of one check, and whether the wait ran out (the job fails)."""

    events: list[Emit] = field(default_factory=list)
    expired: bool = False


class ElasticTimeouts:
    """Checked after every discovery; each waiting state is announced once."""

    def __init__(self, np: int, min_np: int, elastic_timeout: float) -> None:
        self._np = np
        self._min_np = min_np
        self._timeout = elastic_timeout
        self._waiting_logged = False
        self._hosts_wait_logged = False
        self._below_min_since: float | None = None

    def before_start(
        self, now: float, launched: float, available: int, hosts: int, min_hosts: int
    ) -> SlotCheck:
        """Waiting for -np slots and ``min_hosts`` usable hosts since ``launched``."""
        check = SlotCheck()
        if available >= self._np and hosts >= min_hosts:
            return check
        if available < self._np and not self._waiting_logged:
            self._waiting_logged = True
            check.events.append(
                Emit(ev.WAITING_FOR_SLOTS, {"needed": self._np, "available": available})
            )
        if available >= self._np and not self._hosts_wait_logged:
            self._hosts_wait_logged = True
            check.events.append(
                Emit(ev.WAITING_FOR_HOSTS, {"needed": min_hosts, "available": hosts})
            )
        if now - launched > self._timeout:
            fields = {
                "phase": "start",
                "needed": self._np,
                "available": available,
                "waited": now - launched,
            }
            check.events.append(Emit(ev.ELASTIC_TIMEOUT, fields))
            check.expired = True
        return check

    def running(self, now: float, available: int) -> SlotCheck:
        """Below --min-np since the first check that found it so."""
        check = SlotCheck()
        if available < self._min_np:
            if self._below_min_since is None:
                self._below_min_since = now
                check.events.append(
                    Emit(ev.BELOW_MIN_NP, {"slots": available, "min_np": self._min_np})
                )
            elif now - self._below_min_since > self._timeout:
                fields = {
                    "phase": "running",
                    "needed": self._min_np,
                    "available": available,
                    "waited": now - self._below_min_since,
                }
                check.events.append(Emit(ev.ELASTIC_TIMEOUT, fields))
                check.expired = True
        elif self._below_min_since is not None:
            self._below_min_since = None
            check.events.append(
                Emit(ev.MIN_NP_RESTORED, {"slots": available, "min_np": self._min_np})
            )
        return check

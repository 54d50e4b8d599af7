"""Which hosts the job may use, and how many slots each would get: Horovod's
``HostManager`` (runner/elastic/discovery.py) with its blacklist, and
``get_host_assignments``. Pure: every question about the blacklist takes ``now``."""

from __future__ import annotations

import math
import random


def cooldown_seconds(lower: int, upper: int, count: int) -> float:
    """Horovod's cooldown for a host's ``count``-th blacklisting: doubling, with jitter,
    clamped to the given range."""
    delay = lower * (1 << count) + random.uniform(0, 1) * lower
    return float(max(lower, min(upper, delay)))


class HostManager:
    """The discovered hosts in the order they joined, and the blacklist by name: for the
    rest of the job, or until a cooldown (``--blacklist-cooldown-range``) ends."""

    def __init__(self, cooldown_range: tuple[int, int] | None, max_np: int | None) -> None:
        self._cooldown_range = cooldown_range
        self._max_np = max_np
        # None until the first discovery succeeded.
        self.listed: dict[str, int] | None = None
        self._order: list[str] = []
        self._blacklist: dict[str, float] = {}
        self._blacklist_counts: dict[str, int] = {}
        self.ever_blacklisted: set[str] = set()

    def update(self, hosts: dict[str, int]) -> None:
        # Oldest hosts first, as Horovod orders its assignments, so a newcomer never
        # displaces a host that is already training when --max-np caps the job.
        self._order = [h for h in self._order if h in hosts]
        self._order += [h for h in hosts if h not in self._order]
        self.listed = dict(hosts)

    def is_listed(self, host: str) -> bool:
        return self.listed is not None and host in self.listed

    def is_blacklisted(self, host: str, now: float) -> bool:
        return self._blacklist.get(host, 0.0) > now

    def cooled_down(self, hosts: dict[str, int], now: float) -> list[str]:
        """Blacklisted hosts listed in ``hosts`` whose cooldown has ended, in the order
        they were blacklisted."""
        return [h for h, until in self._blacklist.items() if until <= now and h in hosts]

    def unblacklist(self, host: str) -> None:
        del self._blacklist[host]

    def blacklist(self, host: str, now: float) -> float | None:
        """Blacklists ``host``; its cooldown in seconds, None when it is for good."""
        self.ever_blacklisted.add(host)
        if self._cooldown_range is None:
            self._blacklist[host] = math.inf
            return None
        count = self._blacklist_counts.get(host, 0) + 1
        self._blacklist_counts[host] = count
        cooldown = cooldown_seconds(*self._cooldown_range, count)
        self._blacklist[host] = now + cooldown
        return cooldown

    def usable(self, now: float) -> list[str]:
        if self.listed is None:
            return []
        listed = self.listed
        return [h for h in self._order if h in listed and not self.is_blacklisted(h, now)]

    def available_slots(self, now: float) -> int:
        listed = self.listed or {}
        return sum(listed[h] for h in self.usable(now))

    def assignment(self, now: float) -> dict[str, int]:
        """The slots a reset now would assign: usable hosts, oldest first, up to
        --max-np (Horovod's ``get_host_assignments``)."""
        listed = self.listed or {}
        capacity = self._max_np if self._max_np is not None else math.inf
        assignment: dict[str, int] = {}
        for host in self.usable(now):
            want = int(min(listed[host], capacity))
            capacity -= want
            if want > 0:
                assignment[host] = want
        return assignment

"""What an opportunistic job's turn sees of the others (core/sizing/opportunistic.py): their growth
states, read from the ConfigMap cache's events, and when capacity last changed; and of its
own pods, those taken from it that left the cache before a turn saw them taken.

Kept from the watch events the controller receives anyway, so reading it costs a turn
nothing; it tells the event handlers which jobs a change concerns, and nothing here runs
on a timer. A pod of another workload that ends reaches it through capacity_watch.py,
which watches while some job is hungry (its growth backoff is on).
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from mpijob_elastic.core import names
from mpijob_elastic.core.inputs.growth_state import Share, share
from mpijob_elastic.core.inputs.observe import controller_uid
from mpijob_elastic.machinery.capacity_watch import CapacityWatch

Key = tuple[str, str]
Obj = dict[str, Any]

_SUFFIX = names.config_map_name("")
# How long a disrupted pod's last state is kept after it left the cache: long enough for
# its job's next turn (the delete wakes it), even behind a full work queue.
GONE_SECONDS = 60.0


class Fleet:
    def __init__(self, watch: CapacityWatch, wake: Callable[[list[Key]], None]) -> None:
        self.shares: dict[Key, Share] = {}
        self.capacity_changed: datetime | None = None
        self.watch = watch
        watch.changed = lambda: wake(self.changed())
        # Per job, the last states of its pods deleted while disrupted, by UID, with when
        # they went (monotonic seconds); and the same entries oldest first, so that the old
        # ones are let go without a scan of every job at each deletion (a pool's loss
        # deletes thousands of disrupted pods at once).
        self._gone: dict[Key, dict[str, tuple[float, Obj]]] = {}
        self._kept: deque[tuple[float, Key, str]] = deque()

    def config_map(self, type_: str, obj: Obj, job_uid: str | None) -> list[Key]:
        """A job's ConfigMap changed: the jobs to wake (a newly hungry job's peers, which
        may owe it a worker). ``job_uid``: the UID of the job the name points to, None if
        there is none. Only a ConfigMap that job controls is its growth state: any tenant
        can make a ConfigMap with the name and labels (one dated 2099 would hold every
        opportunistic job of the cluster to one worker more than its baseline)."""
        meta = obj["metadata"]
        name = str(meta["name"])
        if not name.endswith(_SUFFIX):
            return []
        key = (str(meta["namespace"]), name[: -len(_SUFFIX)])
        ours = job_uid is not None and controller_uid(obj) == job_uid
        found = None if type_ == "DELETED" or not ours else share(f"{key[0]}/{key[1]}", obj)
        before = self.shares.pop(key, None)
        if found is not None:
            self.shares[key] = found
        self.watch.wanted(any(s.hungry_since is not None for s in self.shares.values()))
        if found is None:
            return []
        if found.hungry_since is None or (before and before.hungry_since == found.hungry_since):
            return []
        return [k for k, s in self.shares.items() if k != key and s.workers >= found.workers + 2]

    def changed(self) -> list[Key]:
        """Capacity may have come free: the hungry jobs, to probe again at once."""
        self.capacity_changed = datetime.now(UTC)
        return [k for k, s in self.shares.items() if s.hungry_since is not None]

    def pod_deleted(self, pod: Obj) -> list[Key]:
        """A pod of ours is gone: its node has room again, unless it was preempted or
        evicted (then that room is someone else's) or never held a node."""
        if not (pod.get("spec") or {}).get("nodeName"):
            return []
        for condition in (pod.get("status") or {}).get("conditions") or []:
            if condition.get("type") == "DisruptionTarget" and condition.get("status") == "True":
                self._keep_gone(pod)
                return []
        return self.changed()

    def _keep_gone(self, pod: Obj) -> None:
        """A preemption's victim can go before its job's turn sees it preempted (a node
        with no kubelet, as on KWOK, or a grace period of 0): the turn reads its last state
        here (``gone``), or the job would grow back into the room at once, and its
        preemption would go unreported."""
        meta = pod["metadata"]
        now = time.monotonic()
        self._forget_old(now)
        for ref in meta.get("ownerReferences") or []:
            if ref.get("controller") and ref.get("kind") == names.KIND:
                key = (str(meta["namespace"]), str(ref.get("name")))
                uid = str(meta.get("uid"))
                self._gone.setdefault(key, {})[uid] = (now, pod)
                self._kept.append((now, key, uid))

    def gone(self, key: Key) -> list[Obj]:
        """The last states of the job's pods deleted while disrupted, lately."""
        self._forget_old(time.monotonic())
        return [pod for _, pod in (self._gone.get(key) or {}).values()]

    def _forget_old(self, now: float) -> None:
        while self._kept and now - self._kept[0][0] >= GONE_SECONDS:
            at, key, uid = self._kept.popleft()
            entries = self._gone.get(key)
            # Kept again since (the same UID deleted twice): that newer entry stays.
            if entries is not None and uid in entries and entries[uid][0] == at:
                del entries[uid]
                if not entries:
                    del self._gone[key]

    def others(self, key: Key) -> list[Share]:
        return [s for k, s in self.shares.items() if k != key]

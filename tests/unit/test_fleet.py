"""The fleet's memory of pods preempted and gone (app/fleet.py): what a job's turn reads
in ``Observed.gone``. The watch that feeds it: tests/integration/test_capacity_watch.py."""

from __future__ import annotations

from typing import Any

import pytest

from mpijob_elastic.app.fleet import GONE_SECONDS, Fleet
from mpijob_elastic.core import names
from mpijob_elastic.machinery.capacity_watch import CapacityWatch


def pod(name: str, uid: str, job: str, *, disrupted: bool) -> dict[str, Any]:
    conditions = [{"type": "DisruptionTarget", "status": "True"}] if disrupted else []
    return {
        "metadata": {
            "name": name,
            "namespace": "ns",
            "uid": uid,
            "ownerReferences": [{"kind": names.KIND, "name": job, "controller": True}],
        },
        "spec": {"nodeName": "n1"},
        "status": {"conditions": conditions},
    }


def test_a_disrupted_pod_s_last_state_is_kept_for_its_job_for_a_while(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    clock = [1000.0]
    monkeypatch.setattr("mpijob_elastic.app.fleet.time.monotonic", lambda: clock[0])
    woken: list[list[tuple[str, str]]] = []
    fleet = Fleet(CapacityWatch(None, ("ns",)), woken.append)  # type: ignore[arg-type]
    victim = pod("a-worker-3", "u3", "a", disrupted=True)
    assert fleet.pod_deleted(victim) == []  # its room is the preemptor's: no capacity wake
    fleet.pod_deleted(pod("a-worker-1", "u1", "a", disrupted=False))
    fleet.pod_deleted(pod("b-worker-0", "u0", "b", disrupted=True))
    assert fleet.gone(("ns", "a")) == [victim]
    assert [p["metadata"]["uid"] for p in fleet.gone(("ns", "b"))] == ["u0"]
    clock[0] += GONE_SECONDS
    assert fleet.gone(("ns", "a")) == []
    # Another job's delete forgets every old state: the memory does not grow with time.
    fleet.pod_deleted(pod("c-worker-0", "u9", "c", disrupted=True))
    assert set(fleet._gone) == {("ns", "c")}


def test_a_state_kept_again_outlives_its_first_keeping(monkeypatch: pytest.MonkeyPatch) -> None:
    """The same pod's deletion seen twice (a relist after a lost watch): its state is kept
    from the second, not dropped when the first keeping runs out."""
    clock = [1000.0]
    monkeypatch.setattr("mpijob_elastic.app.fleet.time.monotonic", lambda: clock[0])
    fleet = Fleet(CapacityWatch(None, ("ns",)), lambda _keys: None)  # type: ignore[arg-type]
    victim = pod("a-worker-3", "u3", "a", disrupted=True)
    fleet.pod_deleted(victim)
    clock[0] += GONE_SECONDS / 2
    fleet.pod_deleted(victim)
    clock[0] += GONE_SECONDS / 2
    assert fleet.gone(("ns", "a")) == [victim]
    clock[0] += GONE_SECONDS / 2
    assert fleet.gone(("ns", "a")) == []
    assert not fleet._gone

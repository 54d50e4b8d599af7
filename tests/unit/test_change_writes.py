"""One change, the writes it needs (issue 33): bench/mass.py counts every write of a
changed job; these pin the ones a change made more than once. The workers of a scale-out
enter the host list together (each host-list change is one reset of Horovod's driver), and
the launcher is not patched for a change of the hostfile alone."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from mpijob_elastic.core import names
from mpijob_elastic.core.hosts.host_list import GATHER_SECONDS
from mpijob_elastic.core.times import format_precise_time
from mpijob_elastic.machinery.kube import ApiError
from tests.unit.simulation import Cluster, discovered, make_job


def elastic(replicas: int, **more: str) -> Cluster:
    annotations = {names.ANN_MIN_REPLICAS: "1", names.ANN_MAX_REPLICAS: "8", **more}
    c = Cluster(make_job(replicas, annotations=annotations))
    c.converge()
    return c


def listed(c: Cluster) -> list[str]:
    return discovered(c.get("ConfigMap", "job-config"))


def start(c: Cluster, name: str) -> None:
    """The pod runs, with its start time as a kubelet reports it (the simulation's pods
    carry none: taken as running for long)."""
    c.world.start(name)
    found = c.get("Pod", name)
    assert found is not None
    pod = copy.deepcopy(found)
    for status in pod["status"]["containerStatuses"]:
        status["state"]["running"]["startedAt"] = format_precise_time(c.now)
    c.world._put(pod)


def test_the_workers_of_a_scale_out_enter_the_host_list_together() -> None:
    # Each host-list change is one reset of the driver: a scale-out by three written as
    # its workers come running would stop every rank three times (seen in bench/mass.py:
    # about three host-list writes per job scaled up).
    c = elastic(2)
    c.set_replicas(5)
    c.apply(c.plan())
    start(c, "job-worker-2")
    c.tick(1)
    c.apply(c.plan())
    assert listed(c) == ["job-worker-0", "job-worker-1"]
    start(c, "job-worker-3")
    c.tick(1)
    c.apply(c.plan())
    assert listed(c) == ["job-worker-0", "job-worker-1"]
    start(c, "job-worker-4")
    c.tick(0.5)
    c.apply(c.plan())
    assert listed(c) == [f"job-worker-{i}" for i in range(5)]


def test_a_slow_sibling_holds_a_running_worker_no_longer_than_the_gather_window() -> None:
    c = elastic(2)
    c.set_replicas(4)
    c.apply(c.plan())
    start(c, "job-worker-2")
    c.tick(GATHER_SECONDS - 0.5)
    p = c.plan()
    assert p.requeue_after is not None
    assert p.requeue_after <= 0.5
    c.apply(p)
    assert listed(c) == ["job-worker-0", "job-worker-1"]
    c.tick(0.5)
    c.apply(c.plan())
    assert listed(c) == ["job-worker-0", "job-worker-1", "job-worker-2"]


def test_before_the_launcher_runs_workers_are_listed_as_they_come() -> None:
    # No driver reads the list yet, and the launcher waits for the workers it needs.
    c = Cluster(make_job(3, annotations={names.ANN_MIN_REPLICAS: "1", names.ANN_MAX_REPLICAS: "8"}))
    c.apply(c.plan())
    start(c, "job-worker-0")
    c.apply(c.plan())
    assert listed(c) == ["job-worker-0"]


def writes(c: Cluster, since: int, kind: str) -> list[dict[str, Any]]:
    return [obj for _, typ, obj in c.world.changes[since:] if obj["kind"] == kind]


def granted(role: dict[str, Any]) -> list[str]:
    rule = next(r for r in role["rules"] if r["resources"] == ["pods/exec"])
    return list(rule["resourceNames"])


def turns(c: Cluster, n: int, vanish: bool = True) -> None:
    for _ in range(n):
        c.apply(c.plan())
        if vanish:
            c.finalize_deletions()
        c.run_pods()
        c.tick(1)


def test_a_hostfile_change_alone_does_not_patch_the_launcher() -> None:
    # The hostfile is read once, at start: a scale-out writes it at its edit, and the
    # launcher is patched (its mounted files refreshed) once its workers are listed.
    c = elastic(2)
    since = len(c.world.changes)
    c.set_replicas(3)
    c.apply(c.plan())
    assert len(writes(c, since, "ConfigMap")) == 1
    refreshes = [p for p in writes(c, since, "Pod") if p["metadata"]["name"] == "job-launcher"]
    assert refreshes == []
    start(c, "job-worker-2")
    c.apply(c.plan())
    refreshes = [p for p in writes(c, since, "Pod") if p["metadata"]["name"] == "job-launcher"]
    assert len(refreshes) == 1


def terminating(c: Cluster) -> list[str]:
    return sorted(p["metadata"]["name"] for p in c.pods if p["metadata"].get("deletionTimestamp"))


def scaled_in(workers: int, to: int) -> Cluster:
    """A job of ``workers`` scaled in to ``to`` with no drain: its victims terminating."""
    c = elastic(workers, **{names.ANN_DRAIN_SECONDS: "0"})
    c.set_replicas(to)
    for _ in range(3):
        c.apply(c.plan())
        c.tick(1)
    return c


def role_names(c: Cluster) -> list[str]:
    role = c.get("Role", "job-launcher")
    assert role is not None
    return granted(role)


def test_a_scale_in_writes_the_role_once_however_its_victims_go() -> None:
    # KWOK, like kubelets, removes a change's victims one by one: the Role used to follow
    # each (bench/mass.py: 2.2 Role writes per job scaled in).
    c = scaled_in(6, 2)
    since = len(c.world.changes)
    going = terminating(c)
    assert len(going) == 4
    for name in going:
        c.world.vanish(name)
        c.apply(c.plan())
        c.tick(1)
    roles = writes(c, since, "Role")
    assert len(roles) == 1
    assert granted(roles[0]) == ["job-worker-0", "job-worker-1"]


def test_a_removed_worker_keeps_its_grant_while_it_terminates() -> None:
    # Its ranks wind down through its remote shell: the driver's removal notice is an
    # exec into it.
    c = scaled_in(4, 2)
    going = terminating(c)
    c.world.vanish(going[0])
    c.apply(c.plan())
    assert going[1] in role_names(c)


def test_a_write_that_adds_a_name_drops_the_names_already_gone() -> None:
    # Two workers lost: their replacements are granted at once, while both terminate.
    # One is gone when the job is scaled out: that write drops it, the other stays.
    c = elastic(4)
    for name in ("job-worker-1", "job-worker-2"):
        c.world.fail(name, reason="Evicted")
    c.apply(c.plan())
    assert terminating(c) == ["job-worker-1", "job-worker-2"]
    c.world.vanish("job-worker-1")
    c.apply(c.plan())
    assert "job-worker-1" in role_names(c)
    c.set_replicas(5)
    c.apply(c.plan())
    names_now = role_names(c)
    assert "job-worker-1" not in names_now
    assert "job-worker-2" in names_now
    assert len(names_now) == 6
    c.finalize_deletions()
    c.apply(c.plan())
    assert set(role_names(c)) == {p["metadata"]["name"] for p in c.world.workers()}


def test_a_gone_name_someone_else_took_is_not_kept_granted() -> None:
    # A scale-out tried the name back and learned that another's pod holds it, then the
    # job was scaled in again before it could use the next index.
    c = scaled_in(4, 2)
    assert terminating(c) == ["job-worker-2", "job-worker-3"]
    c.world.vanish("job-worker-3")
    c.world.objects[("Pod", "job-worker-3")] = {
        "kind": "Pod",
        "metadata": {"name": "job-worker-3", "uid": "foreign", "labels": {}},
        "status": {"phase": "Running"},
    }
    c.set_replicas(3)
    with pytest.raises(ApiError, match="AlreadyExists"):
        c.apply(c.plan())
    c.set_replicas(2)
    c.apply(c.plan())
    assert role_names(c) == ["job-worker-0", "job-worker-1", "job-worker-2"]

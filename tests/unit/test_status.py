"""status.observedGeneration: the spec generation a status was decided from."""

from __future__ import annotations

from mpijob_elastic.core.outputs.status import merge_patch
from tests.unit.simulation import Cluster, make_job


def test_the_status_names_the_generation_it_was_decided_from() -> None:
    job = make_job(2)
    job["metadata"]["generation"] = 3
    c = Cluster(job)
    c.converge()
    assert c.job["status"]["observedGeneration"] == 3
    # A spec edit bumps the generation; the next status follows it, whatever else changes.
    c.job["metadata"]["generation"] = 4
    c.set_replicas(3)
    c.converge()
    assert c.job["status"]["observedGeneration"] == 4


def test_without_a_generation_none_is_claimed() -> None:
    job = make_job(1)
    del job["metadata"]["generation"]
    c = Cluster(job)
    c.converge()
    assert "observedGeneration" not in c.job["status"]


def test_a_status_is_written_as_the_merge_patch_from_the_one_it_was_planned_from() -> None:
    old = {"elastic": {"listed": 2, "workerFailures": 1}, "goodput": {"lostAt": "t"}, "x": 1}
    new = {"elastic": {"listed": 2}, "goodput": {}, "y": [1]}
    patch = merge_patch(old, new)
    assert patch == {
        "x": None,
        "elastic": {"workerFailures": None},
        "goodput": {"lostAt": None},
        "y": [1],
    }
    assert merge_patch(old, old) == {}

"""The controller's state on the ConfigMap (names.STATE_ANNOTATIONS): every annotation it
writes there is one it removes again once the state is cleared, and nobody else's is
touched."""

from __future__ import annotations

import pytest

from mpijob_elastic.core import names
from tests.unit.simulation import Cluster, make_job

FOREIGN = "example.com/owner"


def cm_annotations(c: Cluster) -> dict[str, str]:
    cm = c.get("ConfigMap", "job-config")
    assert cm is not None
    return dict(cm["metadata"].get("annotations") or {})


@pytest.mark.parametrize(
    "annotation", [a for a in names.STATE_ANNOTATIONS if a != names.ANN_WORKERS]
)
def test_a_state_annotation_no_longer_wanted_is_removed(annotation: str) -> None:
    c = Cluster(make_job(2))
    c.converge()
    # A value the planner reads as no state at all, as after the state was cleared.
    c.world.patch(
        "ConfigMap", "job-config", {"metadata": {"annotations": {annotation: "", FOREIGN: "x"}}}
    )
    assert annotation in cm_annotations(c)
    c.converge()
    assert annotation not in cm_annotations(c)
    assert cm_annotations(c)[FOREIGN] == "x"


def test_the_kept_worker_count_is_always_written_back() -> None:
    """The one state a running job always has: its Worker count in force."""
    c = Cluster(make_job(2))
    c.converge()
    assert cm_annotations(c)[names.ANN_WORKERS] == "2"
    c.world.patch("ConfigMap", "job-config", {"metadata": {"annotations": {names.ANN_WORKERS: ""}}})
    c.converge()
    assert cm_annotations(c)[names.ANN_WORKERS] == "2"


def test_every_annotation_of_ours_is_a_setting_a_pod_mark_or_state() -> None:
    """A new annotation for state on the ConfigMap must join STATE_ANNOTATIONS, or the
    controller would never remove it: every ``ANN_`` name is placed in exactly one kind."""
    settings = set(names.USER_ANNOTATIONS)
    on_pods = {names.ANN_DRAINING_SINCE, names.ANN_CONFIG_HASH, names.ANN_NOTICE}
    on_workloads = {names.ANN_WORKLOAD_SLICE}
    state = set(names.STATE_ANNOTATIONS)
    defined = [v for k, v in vars(names).items() if k.startswith("ANN_")]
    assert sorted(defined) == sorted(settings | on_pods | on_workloads | state)
    assert len(settings) == len(names.USER_ANNOTATIONS)
    assert len(state) == len(names.STATE_ANNOTATIONS)
    assert not settings & state
    assert not on_pods & state
    assert not settings & on_pods

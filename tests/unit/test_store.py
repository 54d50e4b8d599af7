"""The informer's store on its own: every rule about what an input does to the cache."""

from __future__ import annotations

import copy
import json
from typing import Any

from mpijob_elastic.core.outputs.status import replica_counts
from mpijob_elastic.core.sizing.capacity import why_not_running
from mpijob_elastic.core.workers import Worker
from mpijob_elastic.machinery.store import (
    ADDED,
    DELETED,
    DELETED_UIDS_KEPT,
    LAST_APPLIED,
    MODIFIED,
    Obj,
    Store,
    compact,
    is_older,
    metadata_only,
    slim,
    slim_pod,
    whole_if_controlled_by,
)


def pod(
    name: str,
    rv: int | str,
    *,
    uid: str | None = None,
    owner: str | None = None,
    controller: bool = True,
    namespace: str = "ns",
    **extra: Any,
) -> Obj:
    meta: Obj = {
        "name": name,
        "namespace": namespace,
        "uid": uid or f"uid-{name}",
        "resourceVersion": str(rv),
    }
    if owner is not None:
        meta["ownerReferences"] = [{"uid": owner, "controller": controller, "name": "job"}]
    meta.update(extra)
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta}


def keys(objs: list[Obj]) -> list[tuple[str, str]]:
    return [(o["metadata"]["namespace"], o["metadata"]["name"]) for o in objs]


def test_list_is_ordered_and_filtered_by_namespace() -> None:
    store = Store()
    for obj in (pod("b", 1), pod("a", 2, namespace="other"), pod("a", 3)):
        store.apply(ADDED, obj)
    assert keys(store.list()) == [("ns", "a"), ("ns", "b"), ("other", "a")]
    assert keys(store.list("other")) == [("other", "a")]
    assert store.list("none") == []
    assert store.get("other", "a") is not None
    assert store.get("ns", "c") is None


def test_by_owner_follows_controller_references_through_changes() -> None:
    store = Store()
    store.apply(ADDED, pod("w-1", 1, owner="job"))
    store.apply(ADDED, pod("w-0", 2, owner="job"))
    store.apply(ADDED, pod("dependent", 3, owner="job", controller=False))
    store.apply(ADDED, pod("orphan", 4))
    assert keys(store.by_owner("job")) == [("ns", "w-0"), ("ns", "w-1")]

    # Adopted by another controller: it leaves the first owner's index.
    store.apply(MODIFIED, pod("w-1", 5, owner="other"))
    assert keys(store.by_owner("job")) == [("ns", "w-0")]
    assert keys(store.by_owner("other")) == [("ns", "w-1")]

    store.apply(DELETED, pod("w-0", 6, owner="job"))
    assert store.by_owner("job") == []
    assert store.by_owner("no-such-uid") == []


def test_metadata_only_keeps_what_says_whose_an_object_is() -> None:
    obj = pod("p", 1, owner="job", labels={"app": "x"}, managedFields=[{"manager": "m"}])
    obj["spec"] = {"containers": [{"name": "main"}]}
    obj["data"] = {"big": "x" * 1000}
    kept = metadata_only(obj)
    assert set(kept) == {"apiVersion", "kind", "metadata"}
    assert kept["metadata"]["labels"] == {"app": "x"}
    assert kept["metadata"]["ownerReferences"] == obj["metadata"]["ownerReferences"]
    assert "managedFields" not in kept["metadata"]
    assert "managedFields" in obj["metadata"]  # the argument is left alone


def test_only_what_a_job_controls_is_kept_whole() -> None:
    """Anyone may put our labels on a ConfigMap of 1 MB (issue 31)."""
    keep = whole_if_controlled_by("MPIJob", "kubeflow.org", compact)
    job = {"apiVersion": "kubeflow.org/v1", "kind": "MPIJob", "name": "job", "uid": "u"}
    data = {"big": "x" * 1000}

    def config_map(*refs: Obj) -> Obj:
        meta = {"name": "c", "namespace": "ns", "ownerReferences": list(refs)}
        return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta, "data": data}

    assert keep(config_map({**job, "controller": True}))["data"] == data
    for refs in (
        (),
        ({**job},),  # an owner, not the controller
        ({**job, "apiVersion": "example.com/v1", "controller": True},),
        ({**job, "kind": "ReplicaSet", "controller": True},),
    ):
        kept = keep(config_map(*refs))
        assert "data" not in kept, refs
        assert kept["metadata"]["name"] == "c"
    store = Store(keep)
    store.apply(ADDED, config_map())
    assert "data" not in (store.get("ns", "c") or {})


def test_watch_event_older_than_an_upserted_write_is_not_stored_or_reported() -> None:
    store = Store()
    assert store.apply(ADDED, pod("a", 1)) is not None
    assert store.upsert(pod("a", 5))
    assert store.apply(MODIFIED, pod("a", 3)) is None
    cached = store.get("ns", "a")
    assert cached is not None
    assert cached["metadata"]["resourceVersion"] == "5"
    # The write's own event arrives later and is reported.
    assert store.apply(MODIFIED, pod("a", 5)) is not None


def test_upsert_never_goes_back_in_time_nor_resurrects() -> None:
    store = Store()
    store.upsert(pod("a", 7))
    assert not store.upsert(pod("a", 6))
    assert store.upsert(pod("a", 7))  # the same version again is harmless
    cached = store.get("ns", "a")
    assert cached is not None
    assert cached["metadata"]["resourceVersion"] == "7"

    assert store.apply(DELETED, pod("a", 8)) is not None
    assert store.get("ns", "a") is None
    # A write result that was in flight when the deletion was seen.
    assert not store.upsert(pod("a", 9))
    assert store.get("ns", "a") is None
    # A new incarnation under the same name is a different UID and is welcome.
    assert store.upsert(pod("a", 10, uid="second"))
    assert store.get("ns", "a") is not None


def test_delete_of_an_old_incarnation_keeps_its_successor() -> None:
    store = Store()
    store.apply(ADDED, pod("a", 1, uid="first", owner="job"))
    # The controller recreated the pod and upserted it before the old one's DELETED came.
    store.upsert(pod("a", 3, uid="second", owner="job"))
    reported = store.apply(DELETED, pod("a", 2, uid="first", owner="job"))
    assert reported is not None
    assert reported["metadata"]["uid"] == "first"
    current = store.get("ns", "a")
    assert current is not None
    assert current["metadata"]["uid"] == "second"
    assert keys(store.by_owner("job")) == [("ns", "a")]


def test_a_replaced_incarnation_is_remembered_as_deleted() -> None:
    store = Store()
    store.apply(ADDED, pod("a", 1, uid="first"))
    store.apply(ADDED, pod("a", 4, uid="second"))
    # A late write result for the first incarnation must not take the name back.
    assert not store.upsert(pod("a", 5, uid="first"))
    current = store.get("ns", "a")
    assert current is not None
    assert current["metadata"]["uid"] == "second"


def test_tombstones_are_bounded_oldest_first() -> None:
    store = Store()
    for n in range(DELETED_UIDS_KEPT + 1):
        store.apply(DELETED, pod(f"p{n}", n + 1))
    # The oldest tombstone fell out; the newest is still honoured.
    assert store.upsert(pod("p0", 1))
    last = DELETED_UIDS_KEPT
    assert not store.upsert(pod(f"p{last}", last + 10))


def test_replace_reports_exactly_the_difference() -> None:
    store = Store()
    for obj in (pod("same", 1), pod("changed", 2), pod("gone", 3)):
        store.apply(ADDED, obj)
    changes = store.replace([pod("same", 1), pod("changed", 10), pod("new", 11)], "12")
    assert sorted((t, o["metadata"]["name"]) for t, o in changes) == [
        (ADDED, "new"),
        (DELETED, "gone"),
        (MODIFIED, "changed"),
    ]
    assert [o["metadata"]["name"] for o in store.list()] == ["changed", "new", "same"]
    # The DELETED change carries the last state known.
    deleted = next(o for t, o in changes if t == DELETED)
    assert deleted["metadata"]["resourceVersion"] == "3"
    assert not store.upsert(pod("gone", 13))


def test_replace_keeps_writes_newer_than_the_list() -> None:
    store = Store()
    store.apply(ADDED, pod("updated", 1))
    # Both written by the controller after the list's snapshot at 10 was taken.
    store.upsert(pod("updated", 12))
    store.upsert(pod("created", 11))
    changes = store.replace([pod("updated", 5)], "10")
    assert changes == []
    assert [o["metadata"]["name"] for o in store.list()] == ["created", "updated"]
    updated = store.get("ns", "updated")
    assert updated is not None
    assert updated["metadata"]["resourceVersion"] == "12"


def test_replace_drops_what_the_list_no_longer_shows_even_if_unversioned() -> None:
    store = Store()
    store.upsert(pod("odd", "not-a-number"))
    assert [t for t, _ in store.replace([], "10")] == [DELETED]
    assert store.list() == []


def test_is_older_compares_numbers_and_refuses_to_guess() -> None:
    assert is_older(pod("a", 9), pod("a", 10))  # not a string comparison
    assert not is_older(pod("a", 10), pod("a", 9))
    assert not is_older(pod("a", 10), pod("a", 10))
    assert not is_older(pod("a", "x"), pod("a", 10))
    assert not is_older(pod("a", 1), {"metadata": {}})


def test_slim_drops_only_write_bookkeeping_and_leaves_its_argument_alone() -> None:
    obj = pod(
        "a",
        1,
        owner="job",
        managedFields=[{"manager": "kubectl", "fieldsV1": {"f:spec": {}}}],
        annotations={LAST_APPLIED: '{"big": "json"}', "keep": "me"},
        labels={"app": "x"},
    )
    obj["spec"] = {"containers": [{"name": "main"}]}
    obj["status"] = {"phase": "Running"}
    before = copy.deepcopy(obj)

    slimmed = slim(obj)

    assert obj == before
    expected = copy.deepcopy(before)
    del expected["metadata"]["managedFields"]
    expected["metadata"]["annotations"] = {"keep": "me"}
    assert slimmed == expected


def test_slim_removes_an_emptied_annotations_map_and_passes_lean_objects_through() -> None:
    obj = pod("a", 1, annotations={LAST_APPLIED: "{}"})
    assert "annotations" not in slim(obj)["metadata"]
    lean = pod("b", 1, annotations={"keep": "me"})
    assert slim(lean) is lean


def test_store_slims_every_way_in_unless_told_otherwise() -> None:
    fat: dict[str, Any] = {"managedFields": [{"manager": "m"}], "annotations": {LAST_APPLIED: "{}"}}
    store = Store()
    store.apply(ADDED, pod("watched", 1, **fat))
    store.upsert(pod("written", 2, **fat))
    store.replace(
        [pod("watched", 1, **fat), pod("written", 2, **fat), pod("listed", 3, **fat)], "3"
    )
    reported = store.apply(DELETED, pod("deleted", 4, **fat))
    assert reported is not None
    for obj in [*store.list(), reported]:
        assert "managedFields" not in obj["metadata"]
        assert "annotations" not in obj["metadata"]

    whole = Store(transform=None)
    whole.apply(ADDED, pod("watched", 1, **fat))
    kept = whole.get("ns", "watched")
    assert kept is not None
    assert kept["metadata"]["managedFields"] == [{"manager": "m"}]


def test_a_custom_transform_sees_every_object_before_it_is_indexed() -> None:
    def adopt(obj: Obj) -> Obj:
        meta = {**obj["metadata"], "ownerReferences": [{"uid": "adopter", "controller": True}]}
        return {**obj, "metadata": meta}

    store = Store(transform=adopt)
    store.apply(ADDED, pod("a", 1))
    store.upsert(pod("b", 2))
    assert keys(store.by_owner("adopter")) == [("ns", "a"), ("ns", "b")]


def kubelet_pod(phase: str, container_state: Obj, *, ready: bool = True, **status: Any) -> Obj:
    """A pod as the API server serves it, with everything a kubelet and defaulting add."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": "job-worker-0",
            "namespace": "ns",
            "uid": "u1",
            "resourceVersion": "7",
            "creationTimestamp": "2026-01-01T00:00:00Z",
            "deletionTimestamp": None,
            "labels": {"mpi-job-name": "job", "mpi-job-role": "worker"},
            "annotations": {"mpijob-elastic.io/draining-since": "2026-01-01T00:00:05.000000Z"},
            "ownerReferences": [{"uid": "job-uid", "controller": True, "name": "job"}],
            "managedFields": [{"manager": "kubelet"}],
        },
        "spec": {
            "nodeName": "node-1",
            "containers": [
                {
                    "name": "main",
                    "image": "busybox",
                    "env": [{"name": "A", "value": "b"}],
                    "readinessProbe": {"exec": {"command": ["true"]}},
                    "volumeMounts": [{"name": "v", "mountPath": "/v"}],
                },
                {"name": "sidecar", "image": "busybox"},
            ],
            "volumes": [{"name": "v", "emptyDir": {}}],
            "tolerations": [{"key": "k", "operator": "Exists"}],
        },
        "status": {
            "phase": phase,
            "hostIP": "10.0.0.1",
            "conditions": [
                {"type": "Ready", "status": "True", "lastTransitionTime": "t"},
                {
                    "type": "PodScheduled",
                    "status": "False",
                    "reason": "Unschedulable",
                    "message": "0/4 nodes are available",
                },
                {"type": "DisruptionTarget", "status": "True", "reason": "EvictionByEvictionAPI"},
            ],
            "containerStatuses": [
                {
                    "name": "main",
                    "ready": ready,
                    "image": "busybox",
                    "imageID": "sha256:x",
                    "restartCount": 0,
                    "state": container_state,
                },
                {"name": "sidecar", "ready": True, "state": {"running": {}}},
            ],
            **status,
        },
    }


def worker_view(pod: Obj) -> tuple[Any, ...]:
    """Everything the planner reads of a worker pod, through the code that reads it."""
    w = Worker(0, pod)
    return (
        w.name,
        w.uid,
        w.phase,
        w.terminating,
        w.draining_since,
        w.marked,
        w.created,
        w.node,
        w.disrupted,
        w.reason,
        w.main_container(None),
        w.exit_code(None),
        w.main_running(None),
        w.running_since(None),
        w.can_take_ranks(None),
        w.can_take_ranks("sidecar"),
        why_not_running(w, None),
        replica_counts([pod]),
    )


def test_slim_pod_keeps_everything_the_planner_reads_of_a_pod() -> None:
    pods = [
        kubelet_pod("Running", {"running": {"startedAt": "2026-01-01T00:00:01Z"}}),
        # Running but not Ready: its readiness probe says it cannot take ranks yet.
        kubelet_pod("Running", {"running": {"startedAt": "2026-01-01T00:00:01Z"}}, ready=False),
        kubelet_pod("Pending", {"waiting": {"reason": "ImagePullBackOff", "message": "no"}}),
        kubelet_pod("Failed", {"terminated": {"exitCode": 3, "reason": "Error"}}, reason="Evicted"),
    ]
    for full in pods:
        kept = slim_pod(copy.deepcopy(full))
        assert worker_view(kept) == worker_view(full)
        assert "managedFields" not in kept["metadata"]
        assert "volumes" not in kept["spec"]
        assert "hostIP" not in kept["status"]
        assert [c["type"] for c in kept["status"]["conditions"]] == [
            "PodScheduled",
            "DisruptionTarget",
        ]


def test_cached_objects_share_their_strings() -> None:
    first, second = (
        compact(json.loads(json.dumps(pod("a", 1, labels={"role": "worker"})))) for _ in range(2)
    )
    k1 = next(iter(first["metadata"]["labels"]))
    k2 = next(iter(second["metadata"]["labels"]))
    assert k1 is k2
    assert first["metadata"]["labels"]["role"] is second["metadata"]["labels"]["role"]

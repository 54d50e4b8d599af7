"""Hand-over (handover.py): which children a job claims, and that nothing else runs first."""

from __future__ import annotations

from typing import Any

from mpijob_elastic.core import names
from mpijob_elastic.core.actions import Claim, Create
from mpijob_elastic.core.inputs.observe import Observed
from mpijob_elastic.core.objects import render_pods
from mpijob_elastic.core.planning import handover
from mpijob_elastic.core.planning.plan import plan_writes
from mpijob_elastic.core.settings import Settings
from mpijob_elastic.core.spec.parse import parse
from tests.unit.simulation import make_job

Obj = dict[str, Any]
JOB = make_job(2)
SETTINGS = Settings()
TO_POD = {names.LABEL_TO_JOB: "job", names.LABEL_TO_OPERATOR: "mpijob-controller"}


def ref(uid: str = "job-uid", controller: bool = True, kind: str = names.KIND) -> Obj:
    return {"apiVersion": "kubeflow.org/v1", "kind": kind, "name": "job", "uid": uid} | (
        {"controller": True, "blockOwnerDeletion": True} if controller else {}
    )


def child(kind: str, name: str, labels: dict[str, str], refs: list[Obj] | None = None) -> Obj:
    meta: Obj = {
        "name": name,
        "namespace": JOB["metadata"]["namespace"],
        "uid": f"uid-{name}",
        "resourceVersion": "7",
        "labels": labels,
    }
    if refs is not None:
        meta["ownerReferences"] = refs
    return {"apiVersion": "v1", "kind": kind, "metadata": meta}


def training_operators() -> list[Obj]:
    """The job's children as training-operator 1.9 labels them (reference §5a)."""
    return [
        child(
            "Pod",
            "job-launcher",
            {**TO_POD, names.LABEL_TO_REPLICA_TYPE: "launcher", names.LABEL_TO_JOB_ROLE: "master"},
            [ref()],
        ),
        *[
            child(
                "Pod",
                f"job-worker-{i}",
                {**TO_POD, names.LABEL_TO_REPLICA_TYPE: "worker", names.LABEL_INDEX: str(i)},
                [ref()],
            )
            for i in range(2)
        ],
        *[
            child(k, "job-launcher", {"app": "job"}, [ref()])
            for k in ("ServiceAccount", "Role", "RoleBinding")
        ],
        child("ConfigMap", "job-config", {"app": "job"}, [ref()]),
    ]


def test_training_operators_children_are_relabelled_before_anything_else() -> None:
    p = plan_writes(Observed(job=JOB, strays=training_operators()), SETTINGS)
    claims = p.of_type(Claim)
    # Nothing but the claims: the job sees none of these children in its own caches yet,
    # so a normal plan would create them (409) and list no hosts.
    assert len(claims) == 7
    assert not p.of_type(Create)
    assert p.requeue_after == 0
    by_name = {(c.kind, c.name): c for c in claims}
    assert all((c.uid, c.resource_version) == (f"uid-{c.name}", "7") for c in claims)
    assert by_name[("Pod", "job-worker-1")].labels == names.pod_labels("job", "worker", 1)
    assert by_name[("Pod", "job-launcher")].labels == names.pod_labels("job", "launcher")
    assert by_name[("Role", "job-launcher")].labels == names.object_labels("job", "launcher")
    assert by_name[("ConfigMap", "job-config")].labels == names.object_labels("job", None)
    (event,) = p.actions[len(claims) :]
    assert event.reason == "TakenOver"  # type: ignore[union-attr]
    assert "Pod job-worker-0" in event.message  # type: ignore[union-attr]


def test_an_orphan_named_and_labelled_as_the_jobs_is_never_adopted() -> None:
    """Anyone who may create pods or ConfigMaps in the namespace can make one (issue 31)."""
    other = {"apiVersion": "v1", "kind": "ConfigMap", "name": "note", "uid": "note-uid"}
    orphans = [
        child("Pod", "job-worker-1", {**TO_POD, names.LABEL_INDEX: "1"}, [other]),
        child("Pod", "job-worker-2", names.pod_labels("job", "worker", 2)),
        child("ConfigMap", "job-config", names.object_labels("job", None)),
        child("RoleBinding", "job-launcher", {"app": "job"}),
    ]
    assert handover.claims(Observed(job=JOB, strays=orphans)) == ([], [])
    assert handover.claims(Observed(job=JOB, pods=orphans[1:2])) == ([], [])


def test_objects_not_the_jobs_are_never_claimed() -> None:
    strays = [
        # Controlled by someone else, even though named and labelled as the job's.
        child("Pod", "job-worker-0", TO_POD, [ref("rs-uid", kind="ReplicaSet")]),
        # Controlled by a job of the same name that is gone (another UID).
        child("Pod", "job-worker-1", TO_POD, [ref("old-uid")]),
        # An orphan labelled for another job, or not labelled at all.
        child("Pod", "job-worker-2", {names.LABEL_TO_JOB: "other"}),
        child("ConfigMap", "job-config", {"team": "a"}),
        # An orphan with the job's labels but no child's name.
        child("Pod", "job-worker-01", TO_POD),
        child("ServiceAccount", "job-config", {"app": "job"}),
        # A pod's app label does not name its job (training-operator puts it only on
        # the launcher's objects and the ConfigMap).
        child("Pod", "job-launcher", {"app": "job"}),
        # No other controller makes a PodDisruptionBudget: never taken over.
        child("PodDisruptionBudget", "job-workers", names.object_labels("job", "worker")),
    ]
    terminating = child("Pod", "job-launcher", TO_POD)
    terminating["metadata"]["deletionTimestamp"] = "2025-01-01T00:00:00Z"
    assert handover.claims(Observed(job=JOB, strays=[*strays, terminating])) == ([], [])


def test_a_job_being_deleted_claims_nothing() -> None:
    job = {**JOB, "metadata": {**JOB["metadata"], "deletionTimestamp": "2025-01-01T00:00:00Z"}}
    assert handover.claims(Observed(job=job, strays=training_operators())) == ([], [])


def test_our_pod_that_lost_a_label_gets_it_back_without_an_event() -> None:
    spec = parse(JOB, 30)
    pod = render_pods.worker_pod(spec, 0)
    pod["metadata"] |= {"uid": "u0", "resourceVersion": "3"}
    pod["metadata"]["labels"] = {
        k: v for k, v in pod["metadata"]["labels"].items() if k != names.LABEL_TO_JOB
    }
    claims, events = handover.claims(Observed(job=JOB, pods=[pod]))
    assert claims == [Claim("Pod", "job-worker-0", "u0", "3", names.pod_labels("job", "worker", 0))]
    assert events == []
    # Whole again: nothing to claim, the job is planned as usual.
    pod["metadata"]["labels"] = render_pods.worker_pod(spec, 0)["metadata"]["labels"]
    assert handover.claims(Observed(job=JOB, pods=[pod])) == ([], [])
    assert handover.claim_writes(Observed(job=JOB, pods=[pod])) is None


def test_a_turn_claims_at_most_its_share_and_comes_back() -> None:
    many = [
        child("Pod", f"job-worker-{i}", {**TO_POD, names.LABEL_INDEX: str(i)}, [ref()])
        for i in range(handover.CLAIMS_PER_TURN + 5)
    ]
    p = handover.claim_writes(Observed(job=JOB, strays=many))
    assert p is not None
    assert len(p.of_type(Claim)) == handover.CLAIMS_PER_TURN
    assert p.requeue_after == 0

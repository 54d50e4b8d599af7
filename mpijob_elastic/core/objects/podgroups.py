"""The PodGroup a gang scheduler reads, and what the job's pods carry to join it.

``--gang-scheduler-name`` chooses the scheduler as training-operator 1.9's flag of that
name does: ``volcano`` for Volcano's PodGroup (``scheduling.volcano.sh/v1beta1``), any
other name for the scheduler-plugins (coscheduling) one (``scheduling.x-k8s.io/v1alpha1``),
that name being the pods' ``schedulerName`` unless their template names one. One name
training-operator does not know is read apart: ``kai-scheduler``, NVIDIA KAI-Scheduler's
own (``scheduling.run.ai/v2alpha2``), whose PodGroups a workload's controller may write
itself since KAI v0.15.0 (its "external PodGroups").

A job that is not elastic gets training-operator 1.9's PodGroup field for field
(``ReconcileJobs`` and ``CalcPGMinResources`` in its pkg/controller.v1/common): named after
the job, the job's annotations, the job as controller, ``minMember`` the launcher and
every worker, ``minResources`` the requests (or, where a container has none, the limits)
of the first ``minMember`` pods, ``schedulingPolicy`` overriding ``minMember``, ``queue``
(Volcano; ``default`` when unset), ``priorityClass`` (Volcano), ``minResources`` and
``scheduleTimeoutSeconds`` (scheduler-plugins). An elastic job's gang is its minimum:
``minMember`` is ``min-replicas`` workers and the launcher, and ``minResources`` theirs,
so the job starts at its minimum and grows past it pod by pod; both are kept in step when
``min-replicas`` changes (training-operator writes the whole spec on each sync as well).

KAI's PodGroup has no ``minResources`` and no timeout: ``minMember``, the queue and the
priority class. KAI schedules the pods above ``minMember`` as elastic, pods it may evict
while the rest run on, which is what opportunistic workers are. Its scheduler leaves a
PodGroup whose queue does not exist unscheduled, so one is always named: the job's
``kai.scheduler/queue`` label (where KAI's own pod grouper reads a workload's queue), else
``schedulingPolicy.queue``, else ``default-queue``, the leaf queue a KAI install creates.
The priority class likewise: the job's ``priorityClassName`` label (KAI's), else
``schedulingPolicy.priorityClass``; none leaves KAI's default priority.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Any

from mpijob_elastic.core import names, quantity
from mpijob_elastic.core.objects.render import owner_reference
from mpijob_elastic.core.settings import Settings
from mpijob_elastic.core.spec.model import JobSpec, ReplicaSpec

Obj = dict[str, Any]

KIND = "PodGroup"
VOLCANO = "volcano"
VOLCANO_API_VERSION = "scheduling.volcano.sh/v1beta1"
SCHEDULER_PLUGINS_API_VERSION = "scheduling.x-k8s.io/v1alpha1"
# KAI's DefaultSchedulerName, and the API version of its PodGroups (KAI v0.17.0).
KAI = "kai-scheduler"
KAI_API_VERSION = "scheduling.run.ai/v2alpha2"
# Volcano's KubeGroupNameAnnotationKey and batch TaskSpecKey (volcano.sh/apis v1.9.0, the
# release training-operator 1.9 builds with); scheduler-plugins' PodGroupLabel.
VOLCANO_GROUP_ANNOTATION = "scheduling.k8s.io/group-name"
VOLCANO_TASK_ANNOTATION = "volcano.sh/task-spec"
SCHEDULER_PLUGINS_LABEL = "scheduling.x-k8s.io/pod-group"
# KAI's PodGroupAnnotationForPod, which its scheduler groups pods by, and
# SkipPodGrouperAnnotation: without it KAI's pod grouper makes a PodGroup of its own for
# the MPIJob and points the pods at that one instead.
KAI_GROUP_ANNOTATION = "pod-group-name"
KAI_SKIP_PODGROUPER_ANNOTATION = "kai.scheduler/skip-podgrouper"
# The job's labels KAI's pod grouper reads a workload's queue and priority class from.
KAI_QUEUE_LABEL = "kai.scheduler/queue"
KAI_PRIORITY_LABEL = "priorityClassName"
KAI_DEFAULT_QUEUE = "default-queue"
# What training-operator 1.9 writes when the job names no Volcano queue.
DEFAULT_QUEUE = "default"
# The phases of a Volcano PodGroup its enqueue action has not admitted yet.
VOLCANO_NOT_ADMITTED = ("", "Pending")


@dataclass(frozen=True)
class Gang:
    # The pods' schedulerName, when their template names none.
    scheduler_name: str
    api_version: str

    @property
    def volcano(self) -> bool:
        return self.api_version == VOLCANO_API_VERSION

    @property
    def kai(self) -> bool:
        return self.api_version == KAI_API_VERSION


def gang(settings: Settings) -> Gang | None:
    name = settings.gang_scheduler_name
    if not name or name.lower() == "none":
        return None
    if name.lower() == VOLCANO:
        return Gang(VOLCANO, VOLCANO_API_VERSION)
    if name.lower() == KAI:
        return Gang(KAI, KAI_API_VERSION)
    return Gang(name, SCHEDULER_PLUGINS_API_VERSION)


def held(gang: Gang | None, pod_group: Mapping[str, Any] | None) -> bool:
    """Whether the job's pods wait for the scheduler to admit its PodGroup: Volcano's
    enqueue action moves it out of ``Pending`` once its queue has room for the gang, and
    training-operator makes no pod before (its DelayPodCreationDueToPodGroup);
    scheduler-plugins and KAI hold the pods themselves until the gang fits, so nothing
    waits for them."""
    if gang is None or not gang.volcano:
        return False
    phase = ((pod_group or {}).get("status") or {}).get("phase") or ""
    return phase in VOLCANO_NOT_ADMITTED


def taken(gang: Gang | None, job: str, conflicts: Collection[tuple[str, str]]) -> bool:
    """Whether an object the job does not control holds its PodGroup's name. Pods join a
    group by its name alone (scheduler-plugins' label, Volcano's and KAI's annotations), so
    any pod the job made would be scheduled as a member of that object's gang: none is made
    until the name is free (issue 31)."""
    return gang is not None and (KIND, job) in conflicts


def min_member(spec: JobSpec) -> int:
    """The launcher and the workers the job needs to run at all."""
    policy = spec.scheduling_policy
    if policy is not None and policy.min_available is not None:
        return policy.min_available
    workers = spec.worker.replicas if spec.bounds.min is None else spec.bounds.min
    return spec.launcher.replicas + workers


def _pod_resources(replica: ReplicaSpec) -> dict[str, quantity.Quantity]:
    """One pod's containers' requests, or limits where a container has no requests at
    all (training-operator's AddResourceList); init containers do not count."""
    total: dict[str, quantity.Quantity] = {}
    for container in replica.containers:
        resources = container.get("resources")
        if not isinstance(resources, Mapping):
            continue
        wanted = resources.get("requests")
        if wanted is None:
            wanted = resources.get("limits")
        for name, text in (wanted if isinstance(wanted, Mapping) else {}).items():
            value = quantity.parse(text)
            if value is not None:
                total[name] = total[name] + value if name in total else value
    return total


def min_resources(spec: JobSpec, members: int) -> dict[str, str]:
    """The requests of the first ``members`` pods, the launcher first.

    training-operator counts the replica types in the order of their pods' priority, and
    in Go's map order among equals; the launcher first gives the same sum whenever the
    gang holds every pod or the launcher and the minimum, the cases this controller makes.
    """
    total: dict[str, quantity.Quantity] = {}
    pods = [(spec.launcher, spec.launcher.replicas), (spec.worker, spec.worker.replicas)]
    counted = 0
    for replica, count in pods:
        each = _pod_resources(replica)
        for _ in range(count):
            if counted >= members:
                break
            counted += 1
            for name, value in each.items():
                total[name] = total[name] + value if name in total else value
    return {name: str(value) for name, value in sorted(total.items())}


def pod_group(
    spec: JobSpec,
    gang: Gang,
    annotations: Mapping[str, str],
    queue: str | None = None,
    labels: Mapping[str, str] | None = None,
) -> Obj:
    """The job's PodGroup. ``annotations``: the job's, copied on create as training-operator
    does (only our own bookkeeping ones are left out); ``queue``: the one an existing
    Volcano PodGroup names, which training-operator keeps over the job's; ``labels``: the
    job's, which name its KAI queue and priority class."""
    policy = spec.scheduling_policy
    members = min_member(spec)
    if policy is not None and policy.min_resources is not None:
        resources = {k: str(v) for k, v in sorted(policy.min_resources.items())}
    else:
        resources = min_resources(spec, members)
    body: Obj
    if gang.volcano:
        body = {
            "minMember": members,
            "queue": queue or (policy.queue if policy and policy.queue else DEFAULT_QUEUE),
            "priorityClassName": policy.priority_class if policy else "",
            "minResources": resources,
        }
    elif gang.kai:
        own = labels or {}
        body = {
            "minMember": members,
            "queue": own.get(KAI_QUEUE_LABEL)
            or (policy.queue if policy and policy.queue else KAI_DEFAULT_QUEUE),
            "priorityClassName": own.get(KAI_PRIORITY_LABEL)
            or (policy.priority_class if policy else ""),
        }
    else:
        timeout = policy.schedule_timeout_seconds if policy else None
        body = {"minMember": members, "minResources": resources, "scheduleTimeoutSeconds": timeout}
    # Go's omitempty: zero numbers, empty strings and nil pointers are left out; Volcano's
    # minResources is a pointer, so an empty one is written, scheduler-plugins' a map.
    spec_body = {
        k: v
        for k, v in body.items()
        if v not in (0, "", None) and not (k == "minResources" and not v and not gang.volcano)
    }
    kept = {k: v for k, v in annotations.items() if k not in names.STATE_ANNOTATIONS}
    metadata: Obj = {
        "name": spec.name,
        "namespace": spec.namespace,
        "ownerReferences": [owner_reference(spec)],
    }
    if kept:
        metadata["annotations"] = kept
    return {"apiVersion": gang.api_version, "kind": KIND, "metadata": metadata, "spec": spec_body}


def join(pod: Obj, job: str, role: str, gang: Gang | None) -> None:
    """The schedulerName (unless the template names one) and the label or annotations that
    make ``pod`` a member of the job's PodGroup (training-operator's
    DecoratePodTemplateSpec; KAI's external PodGroups)."""
    if gang is None:
        return
    pod_spec = pod["spec"]
    if not pod_spec.get("schedulerName"):
        pod_spec["schedulerName"] = gang.scheduler_name
    meta = pod["metadata"]
    if gang.kai:
        annotations = meta.setdefault("annotations", {})
        annotations[KAI_GROUP_ANNOTATION] = job
        annotations[KAI_SKIP_PODGROUPER_ANNOTATION] = "true"
    elif gang.volcano:
        annotations = meta.setdefault("annotations", {})
        annotations[VOLCANO_GROUP_ANNOTATION] = job
        annotations[VOLCANO_TASK_ANNOTATION] = role
    else:
        meta.setdefault("labels", {})[SCHEDULER_PLUGINS_LABEL] = job

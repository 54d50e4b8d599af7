"""Names, labels and annotations that users, their images and the cluster see.

The v1 names and labels are interfaces that existing images and scripts depend on, so they
stay byte-compatible with the upstream v1 controllers. Everything this project adds lives
under the ``mpijob-elastic.io/`` prefix.
"""

from collections.abc import Mapping
from typing import Any, Final

GROUP: Final = "kubeflow.org"
VERSION: Final = "v1"
PLURAL: Final = "mpijobs"
KIND: Final = "MPIJob"
API_VERSION: Final = f"{GROUP}/{VERSION}"

# runPolicy.managedBy values. Training-operator 1.9 reconciles only jobs naming itself, so a
# job naming us runs beside it untouched; in the default mode we also take jobs naming
# training-operator, because we replace it as the v1 MPIJob controller.
MANAGED_BY: Final = "mpijob-elastic.io/controller"
TRAINING_OPERATOR: Final = "kubeflow.org/training-operator"

# v1 labels on every child.
LABEL_GROUP: Final = "group-name"
LABEL_JOB: Final = "mpi-job-name"
LABEL_ROLE: Final = "mpi-job-role"
LABEL_INDEX: Final = "training.kubeflow.org/replica-index"
ROLE_LAUNCHER: Final = "launcher"
ROLE_WORKER: Final = "worker"

# Training-operator 1.9's labels (reference §5a), byte for byte: the Kubeflow training SDK
# and `kubectl get pods -l training.kubeflow.org/job-name=<job>` find a job's pods by them.
# Pods carry the first four (the replica type in lower case, as its role above), the
# launcher also the job role; its ServiceAccount, Role, RoleBinding and ConfigMap `app`.
LABEL_TO_JOB: Final = "training.kubeflow.org/job-name"
LABEL_TO_OPERATOR: Final = "training.kubeflow.org/operator-name"
TO_OPERATOR: Final = "mpijob-controller"
LABEL_TO_REPLICA_TYPE: Final = "training.kubeflow.org/replica-type"
LABEL_TO_JOB_ROLE: Final = "training.kubeflow.org/job-role"
TO_JOB_ROLE_MASTER: Final = "master"
LABEL_APP: Final = "app"

# Per-job settings a user writes on the MPIJob.
ANN_MIN_REPLICAS: Final = "mpijob-elastic.io/min-replicas"
ANN_MAX_REPLICAS: Final = "mpijob-elastic.io/max-replicas"
ANN_DRAIN_SECONDS: Final = "mpijob-elastic.io/drain-seconds"
# How long a new worker may take to run before it is given up (0: wait forever).
ANN_SCALE_OUT_TIMEOUT: Final = "mpijob-elastic.io/scale-out-timeout-seconds"
# Worker pod names to remove gracefully, comma-separated (a named scale-in).
ANN_REMOVE_WORKERS: Final = "mpijob-elastic.io/remove-workers"
# How long a running elastic job may have fewer than min-replicas workers listed before it
# is suspended until capacity returns (unset or 0: never).
ANN_BELOW_MIN_TIMEOUT: Final = "mpijob-elastic.io/below-min-timeout-seconds"
# How long a stop the controller decides (a suspension below the minimum) waits after
# its notice, for the training to checkpoint (notices.py; 0: no wait).
ANN_CHECKPOINT_SECONDS: Final = "mpijob-elastic.io/checkpoint-seconds"

# Notices to the training (notices.py): the controller's current notice for a pod, on every
# launcher and worker pod, shown to its containers as the file NOTICE_MOUNT/NOTICE_FILE by a
# downwardAPI volume (empty when there is none). A template's own volume mounted at
# NOTICE_MOUNT takes precedence: the file is then NOTICE_FALLBACK_MOUNT/NOTICE_FILE.
ANN_NOTICE: Final = "mpijob-elastic.io/notice"
NOTICE_VOLUME: Final = "mpijob-elastic-notice"
NOTICE_MOUNT: Final = "/etc/mpijob-elastic"
NOTICE_FALLBACK_MOUNT: Final = "/var/run/mpijob-elastic"
NOTICE_FILE: Final = "notice"

# Elastic by capacity (opportunistic.py, docs/capacity.md): "true" grows the job above its
# Worker replicas, up to max-replicas, into capacity the scheduler has free, at a low
# priority that anything else may preempt; the PriorityClass its extra workers run at.
ANN_OPPORTUNISTIC: Final = "mpijob-elastic.io/opportunistic"
ANN_OPPORTUNISTIC_PRIORITY_CLASS: Final = "mpijob-elastic.io/opportunistic-priority-class"
# Every annotation a user writes on the MPIJob, the one list of them: the spec's parser
# reads exactly these (spec/parse.py, spec/fields.py), and SpecWarnings calls any other
# annotation under the prefix unknown (spec_warnings.py). The controller's own annotations
# below live on its children: on the job they are as unknown as a typo.
USER_ANNOTATIONS: Final = (
    ANN_MIN_REPLICAS,
    ANN_MAX_REPLICAS,
    ANN_DRAIN_SECONDS,
    ANN_SCALE_OUT_TIMEOUT,
    ANN_REMOVE_WORKERS,
    ANN_BELOW_MIN_TIMEOUT,
    ANN_CHECKPOINT_SECONDS,
    ANN_OPPORTUNISTIC,
    ANN_OPPORTUNISTIC_PRIORITY_CLASS,
)
# On an opportunistic worker: observe counts it, the PodDisruptionBudget leaves it out.
LABEL_OPPORTUNISTIC: Final = "mpijob-elastic.io/opportunistic"
# On the ConfigMap: "<opportunistic workers> <attempts> <since> <retry at> <why>", the growth
# backoff (attempts 0: none) and what the fleet's fair split reads of the job.
ANN_GROWTH: Final = "mpijob-elastic.io/growth"
# On the ConfigMap: preempted workers whose Event waits for their preemptors' names,
# "<deadline> <uid>/<pod> ..." (preemptors.py).
ANN_PREEMPTED: Final = "mpijob-elastic.io/preempted"

# State the controller keeps on the objects it owns, so a restart resumes where it was.
ANN_DRAINING_SINCE: Final = "mpijob-elastic.io/draining-since"
# On a worker that holds ranks (host_rules.py): the PodDisruptionBudget counts only these.
LABEL_HOLDS_RANKS: Final = "mpijob-elastic.io/holds-ranks"
ANN_CONFIG_HASH: Final = "mpijob-elastic.io/config-hash"
# On the ConfigMap: worker indexes never to use again (Horovod may have blacklisted them).
ANN_RETIRED_WORKERS: Final = "mpijob-elastic.io/retired-workers"
# On the ConfigMap: a scale-out that timed out, "<attempts> <retry at> <why>".
ANN_SCALE_OUT_BACKOFF: Final = "mpijob-elastic.io/scale-out-backoff"
# On the ConfigMap: since when a running job has had fewer than min-replicas workers listed.
ANN_BELOW_MIN_SINCE: Final = "mpijob-elastic.io/below-min-since"
# On the ConfigMap: the job is suspended for capacity, "<since> <what the user last set>".
ANN_SUSPENDED: Final = "mpijob-elastic.io/suspended"
# On the ConfigMap: how often the launcher was restarted (runPolicy.backoffLimit).
ANN_LAUNCHER_RESTARTS: Final = "mpijob-elastic.io/launcher-restarts"
# On the ConfigMap: worker failures in a row, "<count> <last at>" (the replacement backoff).
ANN_WORKER_FAILURES: Final = "mpijob-elastic.io/worker-failures"
# On the ConfigMap: the Worker count the job keeps, the last one within its bounds (what an
# out-of-range count leaves in force).
ANN_WORKERS: Final = "mpijob-elastic.io/workers"
# On the ConfigMap: when a discover_hosts.sh change last added hosts (RFC 3339): the
# host-list rules wait for their ranks' reset from then (host_rules.py, rule 1).
ANN_HOSTS_ADDED: Final = "mpijob-elastic.io/hosts-added"
# Every annotation above that the controller keeps on the ConfigMap: its own to set and to
# remove (an annotation not listed here would stay once cleared).
STATE_ANNOTATIONS: Final = (
    ANN_RETIRED_WORKERS,
    ANN_SCALE_OUT_BACKOFF,
    ANN_BELOW_MIN_SINCE,
    ANN_SUSPENDED,
    ANN_LAUNCHER_RESTARTS,
    ANN_WORKER_FAILURES,
    ANN_WORKERS,
    ANN_GROWTH,
    ANN_PREEMPTED,
    ANN_HOSTS_ADDED,
)
# On a Kueue Workload the controller writes for a job: which of the job's Workloads it is,
# 0 for the first (kueue.py).
ANN_WORKLOAD_SLICE: Final = "mpijob-elastic.io/workload-slice"

CONFIG_MOUNT: Final = "/etc/mpi"
HOSTFILE: Final = "hostfile"
KUBEXEC: Final = "kubexec.sh"
DISCOVER_HOSTS: Final = "discover_hosts.sh"


def launcher_name(job: str) -> str:
    return f"{job}-launcher"


# Between a worker's job name and its index: the init container counts workers by it.
WORKER_INFIX: Final = "-worker-"


def worker_name(job: str, index: int) -> str:
    return f"{job}{WORKER_INFIX}{index}"


def config_map_name(job: str) -> str:
    return f"{job}-config"


def ranks_name(job: str) -> str:
    """The ConfigMap the launcher's ``kubexec.sh`` reports its remote shells to (ranks.py)."""
    return f"{job}-ranks"


def disruption_budget_name(job: str) -> str:
    return f"{job}-workers"


def selector(job: str, role: str) -> str:
    """The label selector string of one role's pods, as kubectl and the scale API take it."""
    return f"{LABEL_GROUP}={GROUP},{LABEL_JOB}={job},{LABEL_ROLE}={role}"


def labels(job: str, role: str) -> dict[str, str]:
    """The v1 labels; the workers' PodDisruptionBudget selects by these."""
    return {LABEL_GROUP: GROUP, LABEL_JOB: job, LABEL_ROLE: role}


def pod_labels(job: str, role: str, index: int | None = None) -> dict[str, str]:
    """A launcher's (``index`` None) or worker's labels: v1's and training-operator's."""
    found = {
        **labels(job, role),
        LABEL_TO_JOB: job,
        LABEL_TO_OPERATOR: TO_OPERATOR,
        LABEL_TO_REPLICA_TYPE: role,
    }
    if role == ROLE_LAUNCHER:
        found[LABEL_TO_JOB_ROLE] = TO_JOB_ROLE_MASTER
    if index is not None:
        found[LABEL_INDEX] = str(index)
    return found


def object_labels(job: str, role: str | None) -> dict[str, str]:
    """Labels of a child that is not a pod: v1's (no role on the ConfigMap, ``role``
    None) and training-operator's ``app``."""
    found = {LABEL_GROUP: GROUP, LABEL_JOB: job, LABEL_APP: job}
    if role is not None:
        found[LABEL_ROLE] = role
    return found


def asks_to_grow(job: Mapping[str, Any]) -> bool:
    """The job's ANN_OPPORTUNISTIC says "true": the raw reading, for the checks made before
    the spec is read (what the shell gathers, what the job asks Kueue for). The spec's
    reader judges the value and its bounds (core/spec/fields.py)."""
    meta = job.get("metadata")
    annotations = meta.get("annotations") if isinstance(meta, Mapping) else None
    return isinstance(annotations, Mapping) and annotations.get(ANN_OPPORTUNISTIC) == "true"

"""Pure rendering of the children an MPIJob owns, as plain API dicts.

Formats follow the upstream v1 controllers byte for byte (see docs/formats.md), because
users' images and scripts read them: the ``/etc/mpi`` mount and the launcher environment
in render_pods.py (the pods), the ConfigMap's files (``hostfile``, ``kubexec.sh``,
``discover_hosts.sh``) in formats.py.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from typing import Any

from mpijob_elastic.core import formats, names
from mpijob_elastic.core.settings import KubectlDelivery, Settings
from mpijob_elastic.core.spec.model import JobSpec

# A launcher with a limit on any resource whose name contains this (nvidia.com/gpu,
# amd.com/gpu, gpu.intel.com/i915) requests a GPU: the v1 controllers' rule.
GPU_PATTERN = "gpu"
KUBECTL_DIR = "/opt/kube"

Obj = dict[str, Any]


def owner_reference(spec: JobSpec) -> Obj:
    return job_owner_reference(spec.name, spec.uid)


def job_owner_reference(name: str, uid: str) -> Obj:
    """The job as its children's controller, blocking its deletion until they are gone."""
    return {
        "apiVersion": names.API_VERSION,
        "kind": names.KIND,
        "name": name,
        "uid": uid,
        "controller": True,
        "blockOwnerDeletion": True,
    }


def child_metadata(spec: JobSpec, name: str, labels: dict[str, str]) -> Obj:
    """The metadata of a child the job owns (its pods' too, render_pods.py)."""
    return {
        "name": name,
        "namespace": spec.namespace,
        "labels": labels,
        "ownerReferences": [owner_reference(spec)],
    }


def _launcher_object(spec: JobSpec, name: str | None = None) -> Obj:
    return child_metadata(
        spec,
        name or names.launcher_name(spec.name),
        names.object_labels(spec.name, names.ROLE_LAUNCHER),
    )


def service_account(spec: JobSpec) -> Obj:
    return {
        "apiVersion": "v1",
        "kind": "ServiceAccount",
        "metadata": _launcher_object(spec, spec.service_account),
    }


def role_rules(exec_targets: Sequence[str], ranks: str | None = None) -> list[Obj]:
    """``ranks``: the job's ranks ConfigMap, unless someone else's holds the name: the one
    object the launcher may write, by merge patch, to report its remote shells (ranks.py);
    and read, because ``kubectl patch`` reads the object before it patches."""
    rules: list[Obj] = [
        {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]},
    ]
    if ranks:
        rules.append(
            {
                "apiGroups": [""],
                "resources": ["configmaps"],
                "verbs": ["get", "patch"],
                "resourceNames": [ranks],
            }
        )
    # An empty resourceNames list would mean *every* pod in the namespace, so with no
    # workers the exec rule is left out altogether.
    if exec_targets:
        rules.append(
            {
                "apiGroups": [""],
                "resources": ["pods/exec"],
                "verbs": ["create"],
                "resourceNames": list(exec_targets),
            }
        )
    return rules


def exec_names(role: Mapping[str, Any] | None) -> set[str]:
    """The pods a launcher Role lets the launcher exec into."""
    granted: set[str] = set()
    for rule in (role or {}).get("rules") or []:
        if "pods/exec" in (rule.get("resources") or []):
            granted.update(rule.get("resourceNames") or [])
    return granted


def role(spec: JobSpec, exec_targets: Sequence[str], ranks: bool = False) -> Obj:
    """``exec_targets``: the pods the launcher may exec into (its workers, and itself when
    it is a host); ``ranks``: grant the reports into the job's ranks ConfigMap."""
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "Role",
        "metadata": _launcher_object(spec),
        "rules": role_rules(exec_targets, names.ranks_name(spec.name) if ranks else None),
    }


def ranks_config_map(spec: JobSpec) -> Obj:
    """Empty: the launcher's ``kubexec.sh`` fills it (ranks.py). The job's, like its config."""
    meta = child_metadata(spec, names.ranks_name(spec.name), names.object_labels(spec.name, None))
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta}


def role_binding(spec: JobSpec) -> Obj:
    launcher = names.launcher_name(spec.name)
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "RoleBinding",
        "metadata": _launcher_object(spec),
        "subjects": [
            {"kind": "ServiceAccount", "name": spec.service_account, "namespace": spec.namespace}
        ],
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": launcher},
    }


def requests_gpu(template: Mapping[str, Any]) -> bool:
    """Whether a container (not an init container) of the template has a GPU limit. The
    API server requires a limit for any extended resource requested, so limits suffice."""
    for container in (template.get("spec") or {}).get("containers") or []:
        limits = (container.get("resources") or {}).get("limits") or {}
        if any(GPU_PATTERN in str(key) for key in limits):
            return True
    return False


def launcher_is_host(spec: JobSpec) -> bool:
    """A launcher that requests a GPU runs ranks on it: it is listed as a host (first, as
    in v1), and may exec into itself through kubexec.sh."""
    return requests_gpu(spec.launcher.template)


def hostfile(spec: JobSpec, members: Sequence[str]) -> str:
    """The job's workers (not a range of indexes: a retired name leaves a gap)."""
    launcher = [names.launcher_name(spec.name)] if launcher_is_host(spec) else []
    return formats.hostfile([*launcher, *members], spec.slots_per_worker)


def kubexec(spec: JobSpec, settings: Settings) -> str:
    kubectl = (
        f"{KUBECTL_DIR}/kubectl"
        if settings.kubectl_delivery is KubectlDelivery.INIT_CONTAINER
        else "kubectl"
    )
    return formats.kubexec(kubectl, spec.main_container, names.ranks_name(spec.name))


def discover_hosts(spec: JobSpec, hosts: Sequence[str], launcher: bool = False) -> str:
    """``hosts``: the workers to list; ``launcher``: list the launcher first."""
    first = names.launcher_name(spec.name) if launcher else None
    return formats.discover_hosts(hosts, spec.slots_per_worker, first)


def config_data(
    spec: JobSpec,
    settings: Settings,
    members: Sequence[str],
    hosts: Sequence[str],
    launcher: bool = False,
) -> dict[str, str]:
    return {
        names.HOSTFILE: hostfile(spec, members),
        names.KUBEXEC: kubexec(spec, settings),
        names.DISCOVER_HOSTS: discover_hosts(spec, hosts, launcher),
    }


# The files a running launcher reads again: Horovod's driver runs discover_hosts.sh every
# second and each rank's remote shell runs kubexec.sh. The hostfile is read once, at start
# (mpirun and horovodrun alike): a change of it alone needs no refresh of the launcher.
REREAD = (names.DISCOVER_HOSTS, names.KUBEXEC)


def config_hash(data: Mapping[str, str]) -> str:
    """The hash the launcher's ``names.ANN_CONFIG_HASH`` carries: of the files it reads
    again, so that it is patched (and its mounted files refreshed) when one of them
    changed, not on every write of the ConfigMap."""
    read = {k: v for k, v in data.items() if k in REREAD}
    return hashlib.sha256(json.dumps(read, sort_keys=True).encode()).hexdigest()[:16]


def config_map(
    spec: JobSpec, data: Mapping[str, str], annotations: Mapping[str, str] | None = None
) -> Obj:
    """``annotations``: the job's state that must be stored before any pod create (the
    retired worker indexes, a scale-out backoff), which this object is."""
    # The ConfigMap is the job's, not the launcher's: it carries no role label in v1.
    meta = child_metadata(
        spec, names.config_map_name(spec.name), names.object_labels(spec.name, None)
    )
    if annotations:
        meta["annotations"] = dict(annotations)
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta, "data": dict(data)}


def disruption_budget(spec: JobSpec, min_available: int) -> Obj:
    """Keeps voluntary disruptions (``kubectl drain``, the cluster autoscaler, Karpenter
    consolidation: anything that evicts) from taking the job below ``min_available``
    workers that hold ranks; our own deletes are not evictions and pass. It selects only
    the workers the controller labels as rank-holders (host_rules.py): a replacement that
    runs but holds no rank yet, or whose ranks are still in the reset they joined, does not
    count, so a drain cannot evict the last worker Horovod could reset from before a
    replacement holds ranks, nor one whose removal the driver would miss. A worker that is not
    Ready (crash-looping) may always be evicted: it must never block a node's drain."""
    selector: Obj = {
        "matchLabels": {
            **names.labels(spec.name, names.ROLE_WORKER),
            names.LABEL_HOLDS_RANKS: "true",
        }
    }
    if spec.opportunistic:
        # Opportunistic workers (opportunistic.py) never block a drain or a preemption.
        selector["matchExpressions"] = [
            {"key": names.LABEL_OPPORTUNISTIC, "operator": "DoesNotExist"}
        ]
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        # Labelled like the job's other objects that are not pods; it selects its workers
        # by the v1 labels, which every worker of ours carries, as before.
        "metadata": child_metadata(
            spec,
            names.disruption_budget_name(spec.name),
            names.object_labels(spec.name, names.ROLE_WORKER),
        ),
        "spec": {
            "minAvailable": min_available,
            "selector": selector,
            "unhealthyPodEvictionPolicy": "AlwaysAllow",
        },
    }

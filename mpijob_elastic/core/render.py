"""Pure rendering of the children an MPIJob owns, as plain API dicts.

Formats follow the upstream v1 controllers byte for byte (see docs/formats.md), because
users' images and scripts read them: ``hostfile``, ``kubexec.sh``, ``discover_hosts.sh``,
the ``/etc/mpi`` mount and the launcher environment.
"""

from __future__ import annotations

import copy
import hashlib
import json
from collections.abc import Mapping, Sequence
from typing import Any

from mpijob_elastic.core import names
from mpijob_elastic.core.settings import KubectlDelivery, Settings
from mpijob_elastic.core.spec import JobSpec, ReplicaSpec

# A launcher with a limit on any resource whose name contains this (nvidia.com/gpu,
# amd.com/gpu, gpu.intel.com/i915) requests a GPU: the v1 controllers' rule.
GPU_PATTERN = "gpu"
CONFIG_VOLUME = "mpi-job-config"
KUBECTL_VOLUME = "mpi-job-kubectl"
KUBECTL_DIR = "/opt/kube"
# PID 1 of a worker container whose template has no command (v1 gave it `sleep 365d`).
# The ranks are not its children: `kubectl exec` starts them beside it in the container.
# On SIGTERM (pod deleted, evicted, preempted) a `sleep` ignores the signal and the ranks
# die with exit 137 at the end of the grace period, which Horovod counts as a failure and
# blacklists the host. This script instead keeps the container alive while any other
# process runs in it, so the controller's removal of the terminating pod from
# discover_hosts.sh reaches Horovod and the ranks leave gracefully at their next commit;
# then it exits 0. It never signals the ranks: the kubelet's SIGKILL at the end of the
# grace period is the only bound. Written for any POSIX sh (dash, busybox ash) using only
# builtins besides `sleep`; /proc/<pid>/stat gives each process's state, so zombies (ended,
# not yet reaped) do not count. Without a readable
# /proc it cannot tell, so it waits for the SIGKILL like the `sleep` it replaces.
# The idle sleep is short enough that a SIGTERM landing between `sleep &` and `wait` (the
# trap then runs before `wait` starts) delays the drain by at most a minute.
WORKER_IDLE_SCRIPT = """\
trap 'stop=1' TERM
stop= pid=
busy() {
  [ -r /proc/$$/stat ] || return 0
  for d in /proc/[0-9]*; do
    case ${d#/proc/} in "$$"|"$pid") continue;; esac
    s=; { read -r s < "$d/stat"; } 2>/dev/null
    case ${s##*") "} in ''|Z*|X*) ;; *) return 0;; esac
  done
  return 1
}
while [ -z "$stop" ]; do sleep 60 & pid=$!; [ -n "$stop" ] || wait $pid; kill $pid 2>/dev/null; done
while busy; do sleep 1 & pid=$!; wait $pid; done
"""


def kubelet_literal(script: str) -> str:
    """A script as container command text that the kubelet passes on unchanged.

    The kubelet expands ``$(NAME)`` in a container's command and args and reads ``$$`` as
    an escaped ``$``: the script's ``$$`` (its own PID) would reach the shell as ``$``.
    Doubling every ``$`` makes the kubelet hand over the script exactly as written.
    """
    return script.replace("$", "$$")


WORKER_COMMAND = ["/bin/sh", "-c", kubelet_literal(WORKER_IDLE_SCRIPT)]

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


def _metadata(spec: JobSpec, name: str, labels: dict[str, str]) -> Obj:
    return {
        "name": name,
        "namespace": spec.namespace,
        "labels": labels,
        "ownerReferences": [owner_reference(spec)],
    }


def _launcher_object(spec: JobSpec, name: str | None = None) -> Obj:
    return _metadata(
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
    meta = _metadata(spec, names.ranks_name(spec.name), names.object_labels(spec.name, None))
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
    slots = spec.slots_per_worker
    lines = []
    if launcher_is_host(spec):
        lines.append(f"{names.launcher_name(spec.name)} slots={slots}\n")
    lines += [f"{name} slots={slots}\n" for name in members]
    return "".join(lines)


# kubexec.sh's reports of each remote shell's start and exit (ranks.py), around the v1
# exec line. They never hold up or fail the remote shell: each is a background kubectl,
# bounded, retried twice, its output and errors discarded, and the script's exit status
# is still kubectl exec's own. The background job is a new `sh`, not a subshell: a forked
# subshell would keep the copy of stderr that the shell saves around `2>/dev/null`, and
# so keep the caller's pipe open, which horovodrun reads to its end. Traced lines are
# sent to /dev/null to keep the trace of `set -x` the v1 one. A shell that the caller
# kills by a signal reports no exit: see ranks.py. `$$` and the start second name the
# shell: unique in the launcher.
KUBEXEC_REPORT = """\
{{ R=${{POD_NAME}}_$$_$(date +%s)
case "$*" in *horovod.runner.task_fn*) R=;; esac
report() {{
  [ -n "$R" ] || return 0
  /bin/sh -c 'for t in 1 2 3; do "$0" patch configmap "$1" --type=merge --request-timeout=5s \\
    -p "$2" && break; sleep 1; done' {kubectl} {ranks} "{{\\"data\\":{{\\"$R$1\\":\\"$2\\"}}}}" \\
    </dev/null >/dev/null 2>&1 &
}}
report "" start; }} 2>/dev/null
"""
KUBEXEC_EXIT = "{ rc=$?; report _exit $rc; exit $rc; } 2>/dev/null\n"


def kubexec(spec: JobSpec, settings: Settings) -> str:
    """v1's script, byte for byte up to its exec line, with the reports around it."""
    kubectl = (
        f"{KUBECTL_DIR}/kubectl"
        if settings.kubectl_delivery is KubectlDelivery.INIT_CONTAINER
        else "kubectl"
    )
    # spec.mainContainer was validated as a DNS-1123 label, so it cannot carry shell; the
    # job's name, a DNS-1123 subdomain, cannot either.
    container = f" --container {spec.main_container}" if spec.main_container else ""
    return (
        "#!/bin/sh\n"
        "set -x\n"
        "POD_NAME=$1\n"
        "shift\n"
        + KUBEXEC_REPORT.format(kubectl=kubectl, ranks=names.ranks_name(spec.name))
        + f'{kubectl} exec ${{POD_NAME}}{container} -- /bin/sh -c "$*"\n'
        + KUBEXEC_EXIT
    )


def discover_hosts(spec: JobSpec, hosts: Sequence[str], launcher: bool = False) -> str:
    """``hosts``: the workers to list; ``launcher``: list the launcher first.

    v1 format: no newline after the last line; Horovod reads the output as a set, and
    ignores blank lines. The launcher's line is training-operator 1.9's byte for byte: it
    ends in a newline of its own, so a blank line follows it when workers are listed.
    """
    slots = spec.slots_per_worker
    lines = [f"echo {host}:{slots}" for host in hosts]
    head = "#!/bin/sh\n"
    if launcher:
        head += f"echo {names.launcher_name(spec.name)}:{slots}\n" + ("\n" if lines else "")
    return head + "\n".join(lines)


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


def config_hash(data: Mapping[str, str]) -> str:
    return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()[:16]


def config_map(
    spec: JobSpec, data: Mapping[str, str], annotations: Mapping[str, str] | None = None
) -> Obj:
    """``annotations``: the job's state that must be stored before any pod create (the
    retired worker indexes, a scale-out backoff), which this object is."""
    # The ConfigMap is the job's, not the launcher's: it carries no role label in v1.
    meta = _metadata(spec, names.config_map_name(spec.name), names.object_labels(spec.name, None))
    if annotations:
        meta["annotations"] = dict(annotations)
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta, "data": dict(data)}


def disruption_budget(spec: JobSpec, min_available: int) -> Obj:
    """Keeps voluntary disruptions (``kubectl drain``, the cluster autoscaler, Karpenter
    consolidation: anything that evicts) from taking the job below ``min_available``
    workers; our own deletes are not evictions and pass. A worker that is not Ready
    (Pending, crash-looping) holds no rank, so it may always be evicted: it must never
    block a node's drain."""
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        # Labelled like the job's other objects that are not pods; it selects its workers
        # by the v1 labels, which every worker of ours carries, as before.
        "metadata": _metadata(
            spec,
            names.disruption_budget_name(spec.name),
            names.object_labels(spec.name, names.ROLE_WORKER),
        ),
        "spec": {
            "minAvailable": min_available,
            "selector": {"matchLabels": names.labels(spec.name, names.ROLE_WORKER)},
            "unhealthyPodEvictionPolicy": "AlwaysAllow",
        },
    }


def pod_restart_policy(replica: ReplicaSpec) -> str:
    # ExitCode is decided by the controller from the exit code, so the kubelet must not
    # restart the container itself.
    return "Never" if replica.restart_policy == "ExitCode" else replica.restart_policy


def main_container_index(spec: JobSpec, containers: Sequence[Mapping[str, Any]]) -> int:
    for i, container in enumerate(containers):
        if container.get("name") == spec.main_container:
            return i
    return 0


def _pod(spec: JobSpec, replica: ReplicaSpec, name: str, labels: dict[str, str]) -> Obj:
    template = copy.deepcopy(dict(replica.template))
    meta = template.get("metadata") or {}
    pod_meta = _metadata(spec, name, labels)
    pod_meta["labels"] = {**(meta.get("labels") or {}), **pod_meta["labels"]}
    if meta.get("annotations"):
        pod_meta["annotations"] = dict(meta["annotations"])
    pod_spec = template.get("spec") or {}
    pod_spec["restartPolicy"] = pod_restart_policy(replica)
    return {"apiVersion": "v1", "kind": "Pod", "metadata": pod_meta, "spec": pod_spec}


def _config_volume(spec: JobSpec, items: Sequence[tuple[str, int]]) -> Obj:
    return {
        "name": CONFIG_VOLUME,
        "configMap": {
            "name": names.config_map_name(spec.name),
            "items": [{"key": key, "path": key, "mode": mode} for key, mode in items],
        },
    }


def _mount(container: Obj, name: str, path: str) -> None:
    container.setdefault("volumeMounts", []).append({"name": name, "mountPath": path})


def worker_pod(spec: JobSpec, index: int) -> Obj:
    pod = _pod(
        spec,
        spec.worker,
        names.worker_name(spec.name, index),
        names.pod_labels(spec.name, names.ROLE_WORKER, index),
    )
    pod_spec = pod["spec"]
    pod_spec.setdefault("volumes", []).append(_config_volume(spec, [(names.KUBEXEC, 0o555)]))
    containers = pod_spec["containers"]
    main = containers[main_container_index(spec, containers)]
    _mount(main, CONFIG_VOLUME, names.CONFIG_MOUNT)
    if not main.get("command"):
        main["command"] = list(WORKER_COMMAND)
        # Arguments meant for the image's entrypoint would become the script's $0, $1...;
        # v1 replaced them with its sleep's argument as well.
        main.pop("args", None)
    return pod


def _set_env(container: Obj, values: Mapping[str, str]) -> None:
    """Our ``values`` replace the container's own."""
    env = [e for e in container.get("env") or [] if e.get("name") not in values]
    env += [{"name": k, "value": v} for k, v in values.items()]
    container["env"] = env


def _default_env(container: Obj, values: Mapping[str, str]) -> None:
    """Our ``values`` are added where the container's ``env`` does not set them already.

    ``envFrom`` is not looked at: ``env`` takes precedence over it in Kubernetes, so a
    variable only given there is overridden by ours.
    """
    env = list(container.get("env") or [])
    present = {e.get("name") for e in env}
    env += [{"name": k, "value": v} for k, v in values.items() if k not in present]
    container["env"] = env


# Defaults: a user's own value of any of these is kept (training-operator 1.9 keeps the
# Intel MPI ones; we keep the Open MPI ones too, a user pointing them elsewhere means it).
LAUNCHER_ENV = {
    "OMPI_MCA_plm_rsh_agent": f"{names.CONFIG_MOUNT}/{names.KUBEXEC}",
    "OMPI_MCA_orte_default_hostfile": f"{names.CONFIG_MOUNT}/{names.HOSTFILE}",
    "I_MPI_HYDRA_BOOTSTRAP": "rsh",
    "I_MPI_HYDRA_BOOTSTRAP_EXEC": f"{names.CONFIG_MOUNT}/{names.KUBEXEC}",
}

# The init container waits for the workers the job minimally needs to appear in the
# mounted discover_hosts.sh (not for every worker, as v1 did), then hands kubectl over.
# Only worker lines count: a launcher that is a host is listed too, and is no worker.
KUBECTL_DELIVERY_SCRIPT = (
    "until [ "
    '"$(/bin/sh /etc/mpi/discover_hosts.sh | grep -c "worker-[0-9]*:")" -ge "$MIN_WORKERS" ]; '
    "do sleep 1; done; "
    'cp "$(command -v kubectl)" /opt/kube/kubectl'
)


# The init container only runs a shell loop and copies one file, so it can meet the
# "restricted" Pod Security level whatever the launcher itself needs: a namespace that
# enforces it would otherwise refuse the whole launcher pod. A numeric non-root user,
# because the kubelet refuses runAsNonRoot for an image whose user is root (the default) or
# a name it cannot check.
# The copy target is the emptyDir (world-writable), /etc/mpi is world-readable, and the
# root filesystem is never written. Requests and limits for both cpu and memory, because a
# ResourceQuota on limits refuses pods with any container lacking them; the copy of a
# ~60 MB binary needs little more than its page cache, which is reclaimable, so 128 Mi
# leaves room; the loop needs little CPU.
KUBECTL_DELIVERY_SECURITY_CONTEXT: Obj = {
    "runAsNonRoot": True,
    "runAsUser": 65532,
    "runAsGroup": 65532,
    "allowPrivilegeEscalation": False,
    "readOnlyRootFilesystem": True,
    "capabilities": {"drop": ["ALL"]},
    "seccompProfile": {"type": "RuntimeDefault"},
}
KUBECTL_DELIVERY_RESOURCES: Obj = {
    "requests": {"cpu": "10m", "memory": "32Mi"},
    "limits": {"cpu": "200m", "memory": "128Mi"},
}


def launcher_pod(spec: JobSpec, settings: Settings, hash_: str, min_workers: int) -> Obj:
    pod = _pod(
        spec,
        spec.launcher,
        names.launcher_name(spec.name),
        names.pod_labels(spec.name, names.ROLE_LAUNCHER),
    )
    pod["metadata"].setdefault("annotations", {})[names.ANN_CONFIG_HASH] = hash_
    pod_spec = pod["spec"]
    pod_spec["serviceAccountName"] = spec.service_account
    volumes = pod_spec.setdefault("volumes", [])
    volumes.append(
        _config_volume(
            spec,
            [(names.KUBEXEC, 0o555), (names.HOSTFILE, 0o444), (names.DISCOVER_HOSTS, 0o555)],
        )
    )
    containers = pod_spec["containers"]
    main = containers[main_container_index(spec, containers)]
    _mount(main, CONFIG_VOLUME, names.CONFIG_MOUNT)
    _default_env(main, LAUNCHER_ENV)
    if not requests_gpu(spec.launcher.template):
        # Keep a GPU-less launcher from grabbing the node's GPUs through the NVIDIA runtime,
        # whatever the template says (as v1 did).
        _set_env(main, {"NVIDIA_VISIBLE_DEVICES": "", "NVIDIA_DRIVER_CAPABILITIES": ""})
    if settings.kubectl_delivery is KubectlDelivery.INIT_CONTAINER:
        volumes.append({"name": KUBECTL_VOLUME, "emptyDir": {}})
        _mount(main, KUBECTL_VOLUME, KUBECTL_DIR)
        init: Obj = {
            "name": "kubectl-delivery",
            "image": settings.kubectl_image,
            "command": ["/bin/sh", "-c", kubelet_literal(KUBECTL_DELIVERY_SCRIPT)],
            "env": [{"name": "MIN_WORKERS", "value": str(min_workers)}],
            "securityContext": copy.deepcopy(KUBECTL_DELIVERY_SECURITY_CONTEXT),
            "resources": copy.deepcopy(KUBECTL_DELIVERY_RESOURCES),
        }
        _mount(init, KUBECTL_VOLUME, KUBECTL_DIR)
        _mount(init, CONFIG_VOLUME, names.CONFIG_MOUNT)
        pod_spec["initContainers"] = [*(pod_spec.get("initContainers") or []), init]
    return pod

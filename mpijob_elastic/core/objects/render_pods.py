"""Pure rendering of the launcher and worker pods from their templates.

What the controller adds to a template follows the upstream v1 controllers (see
docs/formats.md), because users' images and scripts rely on it: the ``/etc/mpi`` mount, the
launcher environment, the kubectl delivery init container and the workers' idle command.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from typing import Any

from mpijob_elastic.core import formats, names
from mpijob_elastic.core.objects import podgroups
from mpijob_elastic.core.objects.render import KUBECTL_DIR, Obj, child_metadata, requests_gpu
from mpijob_elastic.core.settings import KubectlDelivery, Settings
from mpijob_elastic.core.spec.model import JobSpec, ReplicaSpec

CONFIG_VOLUME = "mpi-job-config"
KUBECTL_VOLUME = "mpi-job-kubectl"
# The main container of a job's pods: where its notice file is (names.NOTICE_MOUNT, or
# the fallback where the template mounts a volume of its own there).
NOTICE_ENV = "MPIJOB_ELASTIC_NOTICE_FILE"
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
    pod_meta = child_metadata(spec, name, labels)
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


def _notice_file(pod_spec: Obj, main: Obj) -> None:
    """The pod's notice (notices.py) as a file in the main container, where the ranks
    run: a downwardAPI volume of its annotation, which the kubelet rewrites when the
    annotation changes and which needs no API token (``automountServiceAccountToken:
    false`` does not matter). A container that mounts a volume of its own at the notice's
    path keeps it, and gets the file at the fallback path instead; the env variable names
    the path either way."""
    field_path = f"metadata.annotations['{names.ANN_NOTICE}']"
    item = {"path": names.NOTICE_FILE, "fieldRef": {"fieldPath": field_path}}
    pod_spec.setdefault("volumes", []).append(
        {"name": names.NOTICE_VOLUME, "downwardAPI": {"items": [item]}}
    )
    paths = {str(m.get("mountPath", "")).rstrip("/") for m in main.get("volumeMounts") or []}
    mount = names.NOTICE_FALLBACK_MOUNT if names.NOTICE_MOUNT in paths else names.NOTICE_MOUNT
    _mount(main, names.NOTICE_VOLUME, mount)
    _set_env(main, {NOTICE_ENV: f"{mount}/{names.NOTICE_FILE}"})


def worker_pod(spec: JobSpec, index: int, gang: podgroups.Gang | None = None) -> Obj:
    pod = _pod(
        spec,
        spec.worker,
        names.worker_name(spec.name, index),
        names.pod_labels(spec.name, names.ROLE_WORKER, index),
    )
    podgroups.join(pod, spec.name, names.ROLE_WORKER, gang)
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
    _notice_file(pod_spec, main)
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
_LISTED_WORKERS = formats.count_listed_workers(f"{names.CONFIG_MOUNT}/{names.DISCOVER_HOSTS}")
KUBECTL_DELIVERY_SCRIPT = (
    f'until [ "$({_LISTED_WORKERS})" -ge "$MIN_WORKERS" ]; '
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


def launcher_pod(
    spec: JobSpec,
    settings: Settings,
    hash_: str,
    min_workers: int,
    gang: podgroups.Gang | None = None,
) -> Obj:
    pod = _pod(
        spec,
        spec.launcher,
        names.launcher_name(spec.name),
        names.pod_labels(spec.name, names.ROLE_LAUNCHER),
    )
    podgroups.join(pod, spec.name, names.ROLE_LAUNCHER, gang)
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
    _notice_file(pod_spec, main)
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

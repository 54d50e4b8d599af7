"""How the controller reads the pods it owns: which is a worker, and which can take ranks."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from mpijob_elastic.core import formats, names, numbers
from mpijob_elastic.core.times import parse_time


@dataclass(frozen=True)
class Worker:
    index: int
    pod: Mapping[str, Any]

    @property
    def name(self) -> str:
        return str(self.pod["metadata"]["name"])

    @property
    def uid(self) -> str:
        return str(self.pod["metadata"].get("uid", ""))

    @property
    def phase(self) -> str:
        return str((self.pod.get("status") or {}).get("phase", "Pending"))

    @property
    def terminating(self) -> bool:
        return bool(self.pod["metadata"].get("deletionTimestamp"))

    @property
    def draining_since(self) -> datetime | None:
        """When the drain mark says the drain began; None if unmarked or unreadable."""
        annotations = self.pod["metadata"].get("annotations") or {}
        return parse_time(annotations.get(names.ANN_DRAINING_SINCE))

    @property
    def marked(self) -> bool:
        return names.ANN_DRAINING_SINCE in (self.pod["metadata"].get("annotations") or {})

    @property
    def created(self) -> float:
        """creationTimestamp as a POSIX time (0 if unreadable), for "newest first"."""
        t = parse_time(self.pod["metadata"].get("creationTimestamp"))
        return t.timestamp() if t else 0.0

    @property
    def node(self) -> str | None:
        node = (self.pod.get("spec") or {}).get("nodeName")
        return node if isinstance(node, str) and node else None

    @property
    def disrupted(self) -> bool:
        """The pod carries ``DisruptionTarget`` (an eviction, preemption or taint-based
        deletion is about to take it): a worker to give up first."""
        for condition in (self.pod.get("status") or {}).get("conditions") or []:
            if condition.get("type") == "DisruptionTarget" and condition.get("status") == "True":
                return True
        return False

    @property
    def opportunistic(self) -> bool:
        """Created above the job's baseline, at a low priority (opportunistic.py)."""
        labels = self.pod["metadata"].get("labels") or {}
        return labels.get(names.LABEL_OPPORTUNISTIC) == "true"

    @property
    def reason(self) -> str:
        return str((self.pod.get("status") or {}).get("reason", ""))

    def main_container(self, main: str | None) -> str | None:
        """The name of the container the ranks run in: mainContainer, else the first."""
        if main is not None:
            return main
        containers = (self.pod.get("spec") or {}).get("containers") or []
        first = containers[0] if containers and isinstance(containers[0], Mapping) else {}
        name = first.get("name")
        return name if isinstance(name, str) else None

    def _main_status(self, main: str | None) -> Mapping[str, Any] | None:
        wanted = self.main_container(main)
        for status in (self.pod.get("status") or {}).get("containerStatuses") or []:
            if status.get("name") == wanted:
                return status  # type: ignore[no-any-return]
        return None

    def exit_code(self, main: str | None) -> int | None:
        terminated = ((self._main_status(main) or {}).get("state") or {}).get("terminated") or {}
        code = terminated.get("exitCode")
        return code if isinstance(code, int) else None

    def main_running(self, main: str | None) -> bool:
        """Whether the pod runs and its main container, where the ranks live, runs."""
        if self.phase != "Running":
            return False
        status = self._main_status(main)
        return status is not None and "running" in (status.get("state") or {})

    def running_since(self, main: str | None) -> datetime | None:
        """When the main container last started running (None: not running, or unknown)."""
        if not self.main_running(main):
            return None
        running = ((self._main_status(main) or {}).get("state") or {}).get("running") or {}
        return parse_time(running.get("startedAt"))

    def can_take_ranks(self, main: str | None) -> bool:
        """Whether Horovod may exec ranks into this worker now.

        Phase Running only says *some* container runs: a crash-looping main container, or a
        sidecar that is up first, would be listed, Horovod's exec would fail, and the name
        would be blacklisted for good. So the main container itself must be running, and
        Ready too when it has a readiness probe (the user's own "can take work" signal).
        """
        if self.terminating or not self.main_running(main):
            return False
        status = self._main_status(main) or {}
        wanted = self.main_container(main)
        for container in (self.pod.get("spec") or {}).get("containers") or []:
            if container.get("name") == wanted and container.get("readinessProbe"):
                return bool(status.get("ready"))
        return True


def worker_index(job_name: str, pod_name: str) -> int | None:
    """The index a worker pod's name encodes, matched exactly.

    The name, not the index label, is the worker's identity: it is the MPI hostname and the
    Role's resourceName. Upstream trimmed a cutset off the name and deleted wrong pods
    (#352); a pod missing the label made it think the job had no workers.
    """
    prefix = f"{job_name}{names.WORKER_INFIX}"
    if not pod_name.startswith(prefix):
        return None
    digits = pod_name[len(prefix) :]
    # ASCII digits without a leading zero, at most int32: "01" or "\u0661" name no worker of
    # ours, nor does a name of 5000 digits in a hostfile or remove-workers edited by hand.
    if digits.startswith("0") and digits != "0":
        return None
    return numbers.whole(digits)


def split_pods(
    job_name: str, pods: Sequence[Mapping[str, Any]]
) -> tuple[list[Worker], Mapping[str, Any] | None]:
    """The job's workers in index order, and its launcher."""
    workers: list[Worker] = []
    launcher = None
    for pod in pods:
        name = pod["metadata"]["name"]
        labels = pod["metadata"].get("labels") or {}
        # A pod training-operator made, before its hand-over relabels it, has only the
        # replica type.
        role = labels.get(names.LABEL_ROLE) or labels.get(names.LABEL_TO_REPLICA_TYPE)
        if role == names.ROLE_LAUNCHER and name == names.launcher_name(job_name):
            launcher = pod
        elif role == names.ROLE_WORKER:
            index = worker_index(job_name, name)
            if index is not None:
                workers.append(Worker(index, pod))
    workers.sort(key=lambda w: w.index)
    return workers, launcher


def discovered_hosts(config_data: Mapping[str, Any] | None) -> set[str]:
    """The hosts ``discover_hosts.sh`` names: the ones Horovod may have given ranks."""
    return set(
        formats.discover_hosts_hosts(str((config_data or {}).get(names.DISCOVER_HOSTS) or ""))
    )


def _hostfile_hosts(config_data: Mapping[str, Any] | None) -> set[str]:
    return set(formats.hostfile_hosts(str((config_data or {}).get(names.HOSTFILE) or "")))


def hostfile_workers(job_name: str, config_data: Mapping[str, Any] | None) -> set[str]:
    """The workers the ``hostfile`` we last wrote names: the job's members then."""
    return _hostfile_hosts(config_data) - {names.launcher_name(job_name)}


def listed_hosts(config_data: Mapping[str, Any] | None) -> set[str]:
    """Every host the launcher can see in the files we wrote: hostfile and discovery.

    A worker named here has not begun to drain, whatever its pod's mark says.
    """
    return discovered_hosts(config_data) | _hostfile_hosts(config_data)

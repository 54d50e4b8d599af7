"""Issue 22 on the real local cluster: notices to the training on the pods, the checkpoint
window before a suspension below the minimum, and a scale-in victim noticed before it is
unlisted. KWOK has no kubelet, so the downwardAPI file itself is read on kind
(e2e/test_notices.py); here the API server holds the annotation it is made from, and the
pod specs carry the volume. A spot taint on the launcher's node is e2e/test_notices.py's
alone: it runs there on KWOK and on kind."""

from __future__ import annotations

import json
import subprocess
import threading
import time
from datetime import UTC, datetime
from typing import Any

import pytest

from mpijob_elastic.core import names
from mpijob_elastic.core.lifecycle.notices import parse_notice
from mpijob_elastic.core.times import format_time, parse_time
from tests.cluster import Cluster
from tests.controller import wait_for
from tests.integration.test_controller import Job, elastic_job
from tests.integration.test_membership import fill, running_launcher, unfill

pytestmark = pytest.mark.usefixtures("crd")


@pytest.fixture
def job(cluster: Cluster, shared_namespace: str) -> Job:
    """A job in a namespace of the module's shared controller (tests/controller.py)."""
    return Job(cluster, shared_namespace, "noticed")


def notices(job: Job) -> dict[str, str | None]:
    pods = {**job.pods(), **job.pods(names.ROLE_LAUNCHER)}
    return {
        n: (p["metadata"].get("annotations") or {}).get(names.ANN_NOTICE)
        for n, p in pods.items()
        if not p["metadata"].get("deletionTimestamp")
    }


class Watch:
    """``kubectl get <kind> -w``: every version of the namespace's objects of one kind, in
    the order the API server committed them."""

    def __init__(self, cluster: Cluster, ns: str, kind: str) -> None:
        self.versions: list[dict[str, Any]] = []
        cmd = [cluster.kubectl_path, "--kubeconfig", cluster.kubeconfig, "get", kind]
        cmd += ["-n", ns, "-w", "-o", "json"]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        decoder, buffer = json.JSONDecoder(), ""
        for line in self.proc.stdout:
            buffer += line
            try:
                obj, end = decoder.raw_decode(buffer.strip())
            except json.JSONDecodeError:
                continue
            self.versions.append(obj)
            buffer = buffer.strip()[end:]

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait()


def revision(obj: dict[str, Any]) -> int:
    # The etcd revision of the write: one counter for every kind.
    return int(obj["metadata"]["resourceVersion"])


def test_a_scale_in_victim_is_noticed_before_it_is_unlisted(cluster: Cluster, job: Job) -> None:
    job.create(elastic_job(job.name, 3, drain="10"))
    job.wait_hosts(3)
    running_launcher(job)
    pod = job.pods()[names.worker_name(job.name, 0)]
    volume = next(v for v in pod["spec"]["volumes"] if v["name"] == names.NOTICE_VOLUME)
    assert volume["downwardAPI"]["items"][0]["fieldRef"]["fieldPath"] == (
        f"metadata.annotations['{names.ANN_NOTICE}']"
    )
    victim = names.worker_name(job.name, 2)
    pods, maps = Watch(cluster, job.ns, "pods"), Watch(cluster, job.ns, "configmaps")

    def noticed() -> list[int]:
        return [
            revision(p)
            for p in list(pods.versions)
            if p["metadata"]["name"] == victim
            and (p["metadata"].get("annotations") or {}).get(names.ANN_NOTICE)
        ]

    def unlisted() -> list[int]:
        return [
            revision(c)
            for c in list(maps.versions)
            if c["metadata"]["name"] == names.config_map_name(job.name)
            and victim not in (c.get("data") or {}).get(names.DISCOVER_HOSTS, victim)
        ]

    try:
        # Each watch prints what it listed first (the job's pods, its ConfigMap), then
        # every change from there on.
        wait_for(lambda: pods.versions and maps.versions, 30, "both watches listed")
        job.set_workers(2)
        job.wait_hosts(2)
        wait_for(noticed, 10, "the watch to see the notice")
        wait_for(unlisted, 10, "the watch to see the host list drop the victim")
    finally:
        pods.stop()
        maps.stop()
    assert min(noticed()) < min(unlisted())
    found = parse_notice(notices(job)[victim])
    assert found is not None
    assert found[0] == "worker-leaving"
    assert found[2] == "scale-in"
    assert notices(job)[names.worker_name(job.name, 0)] is None


def test_below_the_minimum_the_notice_comes_a_checkpoint_window_before_the_stop(
    cluster: Cluster, job: Job
) -> None:
    manifest = elastic_job(job.name, 2, min_replicas="2")
    annotations = manifest["metadata"]["annotations"]
    annotations[names.ANN_BELOW_MIN_TIMEOUT] = "2"
    annotations[names.ANN_CHECKPOINT_SECONDS] = "5"
    annotations[names.ANN_SCALE_OUT_TIMEOUT] = "30"
    for role in ("Launcher", "Worker"):
        template = manifest["spec"]["mpiReplicaSpecs"][role]["template"]["spec"]
        # The notice's file needs no API token.
        template["automountServiceAccountToken"] = False
    job.create(manifest)
    job.wait_hosts(2)
    running_launcher(job)
    launcher = names.launcher_name(job.name)
    try:
        fill(cluster)
        lost = names.worker_name(job.name, 1)
        cluster.kubectl("delete", "pod", lost, "-n", job.ns, "--grace-period=0", "--force")
        lost_at = time.monotonic()

        def posted() -> bool:
            found = parse_notice(notices(job).get(launcher))
            return found is not None and found[2] == "below-min"

        wait_for(posted, 15, "the job-stopping notice on the launcher")
        noticed_at = time.monotonic()
        text = notices(job)[launcher]
        assert text is not None
        assert text.startswith("job-stopping ")
        assert notices(job)[names.worker_name(job.name, 0)] == text, "every pod, the same"
        found = parse_notice(text)
        assert found is not None
        deadline = found[1]
        # The deadline is the checkpoint window after the decision, as the Event says.
        due = f"stopping at {format_time(deadline)}, 5s to checkpoint"
        wait_for(
            lambda: any(r == "StopNoticed" and due in m for _, r, m in job.events()),
            10,
            f"a StopNoticed Event saying {due!r}",
        )
        # The window: until the notice's deadline (the test waits for it anyway), the
        # launcher runs on and the job is not suspended.
        while datetime.now(UTC) < deadline:
            assert launcher in notices(job), "the launcher runs on in the window"
            assert (job.condition("Suspended") or {}).get("status") != "True"
            time.sleep(0.2)

        def suspended() -> bool:
            cond = job.condition("Suspended") or {}
            return cond.get("status") == "True" and not job.pods(names.ROLE_LAUNCHER)

        wait_for(suspended, 20, "suspended after the window")
        stopped_at = time.monotonic()
        since = parse_time((job.condition("Suspended") or {}).get("lastTransitionTime"))
        assert since is not None
        assert since >= deadline, f"suspended at {since}, before the deadline {deadline}"
        # The probe's workers are new pods: no notice on them.
        wait_for(lambda: len(job.workers()) == 2, 15, "the probe's workers")
        assert all(v is None for v in notices(job).values())
    finally:
        unfill(cluster)
    running_launcher(job)
    assert all(v is None for v in notices(job).values())
    print(
        f"FIGURE notice posted {noticed_at - lost_at:.2f}s after the worker was lost "
        f"(below-min timeout 2s); job stopped {stopped_at - noticed_at:.2f}s after the "
        "notice (checkpoint window 5s)"
    )


def test_back_at_the_minimum_in_the_window_the_job_runs_on(cluster: Cluster, job: Job) -> None:
    manifest = elastic_job(job.name, 2, min_replicas="2")
    annotations = manifest["metadata"]["annotations"]
    annotations[names.ANN_BELOW_MIN_TIMEOUT] = "1"
    annotations[names.ANN_CHECKPOINT_SECONDS] = "30"
    job.create(manifest)
    job.wait_hosts(2)
    running_launcher(job)
    launcher = names.launcher_name(job.name)
    uid = job.pods(names.ROLE_LAUNCHER)[launcher]["metadata"]["uid"]
    try:
        fill(cluster)
        lost = names.worker_name(job.name, 1)
        cluster.kubectl("delete", "pod", lost, "-n", job.ns, "--grace-period=0", "--force")
        wait_for(lambda: notices(job).get(launcher) is not None, 15, "the notice")
    finally:
        unfill(cluster)
    wait_for(lambda: len(job.hosts()) == 2, 20, "back at the minimum")
    wait_for(lambda: notices(job).get(launcher) is None, 10, "the notice removed")
    assert job.pods(names.ROLE_LAUNCHER)[launcher]["metadata"]["uid"] == uid
    assert (job.condition("Suspended") or {}).get("status") != "True"

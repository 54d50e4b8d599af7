"""End to end: a notice reaches the training's containers (issue 22).

A spot-interruption taint on the launcher's node gives every pod of the job a
``job-stopping`` notice (docs/formats.md, "The notice"); removing the taint removes it.
On kind (``E2E_IN_CLUSTER=1``, hack/e2e-kind.sh) the kubelet writes it into the
``downwardAPI`` file ``/etc/mpijob-elastic/notice`` of the real containers, and the helper
``contrib/mpijob_elastic_notice.py``, run inside them on its own (``python3 -`` from
stdin), reads it: this measures the kubelet's refresh, annotation → file. KWOK has no
kubelet, so there the test checks what the API server holds (the annotation, the volume in
the pod spec) and nothing of the file.

The job has no elastic bounds, so nothing moves off the tainted node: the notice is the
only change.

Then the mock training honours the notice across a stop (below the minimum; the
launcher's node tainted, then reclaimed): it saves its step on the notice and the next
launcher resumes from it, at most one commit behind (e2e/README.md).
"""

from __future__ import annotations

import copy
import json
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from e2e.harness import ElasticRun, in_cluster_job
from e2e.mockhorovod import events as ev
from mpijob_elastic.core import names
from mpijob_elastic.core.lifecycle.notices import parse_notice
from tests.cluster import ROOT, Cluster
from tests.controller import ControllerProcess, wait_for
from tests.manifests import mpijob

IN_CLUSTER = os.environ.get("E2E_IN_CLUSTER") == "1"
HELPER = ROOT / "contrib" / "mpijob_elastic_notice.py"
TAINT = "aws-node-termination-handler/spot-itn"
NOTICE_FILE = f"{names.NOTICE_MOUNT}/{names.NOTICE_FILE}"
SAMPLE = ROOT / "config" / "samples" / "elastic-mpijob.yaml"


def job_manifest(name: str) -> dict[str, Any]:
    job = mpijob(name, 2)
    specs = job["spec"]["mpiReplicaSpecs"]
    # ``mpijob`` shares one template between the roles: on kind each gets its own image.
    specs["Worker"]["template"] = copy.deepcopy(specs["Launcher"]["template"])
    if IN_CLUSTER:
        launcher = specs["Launcher"]["template"]["spec"]["containers"][0]
        launcher["image"] = os.environ["E2E_LAUNCHER_IMAGE"]
        launcher["command"] = ["sleep", "3600"]
        specs["Worker"]["template"]["spec"]["containers"][0]["image"] = os.environ[
            "E2E_WORKER_IMAGE"
        ]
    for role in ("Launcher", "Worker"):
        # The file needs no API token.
        specs[role]["template"]["spec"]["automountServiceAccountToken"] = False
    return job


class Pods:
    def __init__(self, cluster: Cluster, ns: str, job: str) -> None:
        self.cluster, self.ns, self.job = cluster, ns, job

    def get(self) -> dict[str, dict[str, Any]]:
        selector = f"{names.LABEL_GROUP}={names.GROUP},{names.LABEL_JOB}={self.job}"
        selector = selector.replace(",", "%2C").replace("=", "%3D")
        listed = self.cluster.raw(
            "GET", f"/api/v1/namespaces/{self.ns}/pods?labelSelector={selector}"
        )
        return {p["metadata"]["name"]: p for p in (listed or {}).get("items", [])}

    def notices(self) -> dict[str, str | None]:
        return {
            n: (p["metadata"].get("annotations") or {}).get(names.ANN_NOTICE)
            for n, p in self.get().items()
        }

    def read_file(self, pod: str) -> str:
        return self.cluster.kubectl(
            "exec", "-n", self.ns, pod, "--", "cat", NOTICE_FILE, check=False
        ).stdout


def watch_files(
    pods: Pods, names_: list[str], want: Callable[[str, str], bool], seen: dict[str, float]
) -> list[threading.Thread]:
    """Record in ``seen`` when each pod's file first reads as wanted, reading it in a
    loop (one ``kubectl exec`` per read, the resolution); the threads, started."""

    def one(pod: str) -> None:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and pod not in seen:
            if want(pod, pods.read_file(pod)):
                seen[pod] = time.monotonic()
            time.sleep(0.05)

    threads = [threading.Thread(target=one, args=(p,), daemon=True) for p in names_]
    for t in threads:
        t.start()
    return threads


def exec_seconds(pods: Pods, pod: str) -> float:
    started = time.monotonic()
    pods.read_file(pod)
    return time.monotonic() - started


def test_a_spot_taint_on_the_launcher_s_node_reaches_every_container(
    cluster: Cluster, e2e_namespace: str, controller: ControllerProcess | None
) -> None:
    name = "noticed"
    cluster.kubectl("apply", "-n", e2e_namespace, "-f", "-", input=json.dumps(job_manifest(name)))
    pods = Pods(cluster, e2e_namespace, name)
    launcher = names.launcher_name(name)

    def running() -> bool:
        found = pods.get()
        return len(found) == 3 and all(
            (p.get("status") or {}).get("phase") == "Running" for p in found.values()
        )

    wait_for(running, 180, "the launcher and both workers running")
    every = sorted(pods.get())
    for obj in pods.get().values():
        volume = next(v for v in obj["spec"]["volumes"] if v["name"] == names.NOTICE_VOLUME)
        assert "downwardAPI" in volume
    if IN_CLUSTER:
        assert all(pods.read_file(p) == "" for p in every), "no notice: an empty file"
    node = pods.get()[launcher]["spec"]["nodeName"]
    try:
        seen: dict[str, float] = {}
        # Read from before the notice on, so a file is seen at most one read after it
        # changes.
        readers = watch_files(pods, every, lambda _, text: text != "", seen) if IN_CLUSTER else []
        tainted = time.monotonic()
        cluster.kubectl("taint", "node", node, f"{TAINT}=:NoSchedule")
        annotated: dict[str, float] = {}

        def all_annotated() -> bool:
            for pod, text in pods.notices().items():
                if text and pod not in annotated:
                    annotated[pod] = time.monotonic()
            return set(annotated) == set(every)

        wait_for(all_annotated, 30, "every pod annotated")
        texts = pods.notices()
        found = parse_notice(texts[launcher])
        assert found is not None
        assert (found[0], found[2]) == ("job-stopping", "launcher-node-leaving")
        assert f"node {node} is tainted {TAINT}" in str(texts[launcher]), texts[launcher]
        assert len(set(texts.values())) == 1, texts
        lines = [f"taint -> annotation: {max(annotated.values()) - tainted:.2f}s (last pod)"]
        if IN_CLUSTER:
            for t in readers:
                t.join()
            assert set(seen) == set(every), f"files seen {seen}, annotations {annotated}"
            assert all(pods.read_file(p) == texts[p] for p in every), "the annotation, verbatim"
            delays = [seen[p] - annotated[p] for p in every]
            lines.append(
                f"annotation -> file visible: {min(delays):.2f}-{max(delays):.2f}s "
                f"over {len(every)} pods (read by kubectl exec, "
                f"{exec_seconds(pods, every[0]):.2f}s a read)"
            )
            # The helper, copied in on its own, reads it in a real container.
            for pod in (launcher, every[-1]):
                done = cluster.kubectl(
                    "exec", "-i", "-n", e2e_namespace, pod, "--", "python3", "-",
                    input=HELPER.read_text(), check=False,
                )  # fmt: skip
                assert done.returncode == 0, (done.stdout, done.stderr)
                assert done.stdout.startswith("job-stopping launcher-node-leaving in "), done
    finally:
        cluster.kubectl("taint", "node", node, f"{TAINT}-", check=False)
    untainted = time.monotonic()
    wait_for(lambda: not any(pods.notices().values()), 30, "every notice removed")
    lines.append(f"untaint -> annotations removed: {time.monotonic() - untainted:.2f}s")
    if IN_CLUSTER:
        cleared: dict[str, float] = {}
        removed = time.monotonic()
        for t in watch_files(pods, every, lambda _, text: text == "", cleared):
            t.join()
        assert set(cleared) == set(every)
        lines.append(f"annotations removed -> files empty: {max(cleared.values()) - removed:.2f}s")
    print("\nFIGURE " + "\nFIGURE ".join(lines))
    cluster.kubectl("delete", "mpijob", name, "-n", e2e_namespace, "--wait=false")


FULL = "example.com/full=:NoSchedule"
CHECKPOINT_IN_POD = "/ckpt/step"


def nodes(cluster: Cluster) -> list[str]:
    listed = json.loads(cluster.kubectl("get", "nodes", "-o", "json").stdout)["items"]
    return [n["metadata"]["name"] for n in listed]


def checkpointed_job(name: str, checkpoint: str, launcher_node: str) -> dict[str, Any]:
    """An elastic job at its minimum of 2 whose driver keeps a checkpoint (checkpoint.py).
    On kind the checkpoint is a hostPath on the launcher's node, which the next launcher
    (pinned there) mounts again: a volume that outlives the launcher, as a user's would."""
    job: dict[str, Any] = yaml.safe_load(SAMPLE.read_text())
    args = ("-np", "2", "--min-np", "2", "--max-np", "3", "--checkpoint-file", checkpoint)
    if IN_CLUSTER:
        in_cluster_job(job, os.environ["E2E_LAUNCHER_IMAGE"], os.environ["E2E_WORKER_IMAGE"], args)
        spec = job["spec"]["mpiReplicaSpecs"]["Launcher"]["template"]["spec"]
        spec["nodeSelector"] = {"kubernetes.io/hostname": launcher_node}
        spec["volumes"] = [
            {"name": "ckpt", "hostPath": {"path": f"/tmp/{name}-ckpt", "type": "DirectoryOrCreate"}}
        ]
        spec["containers"][0]["volumeMounts"] = [{"name": "ckpt", "mountPath": "/ckpt"}]
    job["metadata"]["name"] = name
    job["metadata"]["annotations"].update(
        {
            names.ANN_MIN_REPLICAS: "2",
            names.ANN_MAX_REPLICAS: "3",
            names.ANN_DRAIN_SECONDS: "15",
            names.ANN_BELOW_MIN_TIMEOUT: "3",
            names.ANN_CHECKPOINT_SECONDS: "8",
        }
    )
    return job


def checkpointed_run(
    cluster: Cluster, namespace: str, name: str, workdir: Path, launcher_node: str
) -> ElasticRun:
    """The run of ``checkpointed_job``: its checkpoint in the launcher (kind) or in
    ``workdir`` (KWOK, where the driver runs here)."""
    checkpoint = CHECKPOINT_IN_POD if IN_CLUSTER else str(workdir / "checkpoint")
    return ElasticRun(
        cluster,
        namespace,
        checkpointed_job(name, checkpoint, launcher_node),
        workdir,
        driver_args=("-np", "2", "--min-np", "2", "--max-np", "3", "--checkpoint-file", checkpoint),
        in_cluster=IN_CLUSTER,
    )


def resume(run: ElasticRun, pods: Pods, old_uid: str) -> list[dict[str, Any]]:
    """The new launcher's run, once it has loaded the checkpoint: its event, in a list."""
    launcher = names.launcher_name(run.job)

    def back() -> bool:
        pod = pods.get().get(launcher) or {}
        return (
            pod.get("metadata", {}).get("uid") not in (None, old_uid)
            and (pod.get("status") or {}).get("phase") == "Running"
        )

    wait_for(back, 120, "a new launcher running")
    if not IN_CLUSTER:
        run.start_launcher()
    # On KWOK the record goes on in the same file; on kind it is the new launcher's log.
    runs = 1 if IN_CLUSTER else 2
    found: list[dict[str, Any]] = wait_for(
        lambda: run.driver_events(ev.CHECKPOINT_LOADED)[runs - 1 :], 60, "a resumed run"
    )
    return found


@pytest.mark.parametrize("cause", ["below-min", "launcher-node-leaving"])
def test_a_stop_keeps_the_training_s_progress(
    cluster: Cluster,
    e2e_namespace: str,
    controller: ControllerProcess | None,
    tmp_path_factory: pytest.TempPathFactory,
    request: pytest.FixtureRequest,
    cause: str,
) -> None:
    """The mock training honours the notice: the driver (rank 0's notice thread, the
    mock's steps being its commits) saves its step while a job-stopping notice is up.

    ``below-min``: a worker lost with no capacity left; the job suspends after the
    checkpoint window; capacity returns. ``launcher-node-leaving``: a spot taint on the
    launcher's node, then the reclaim (the launcher force-deleted), then the node back.
    Either way the new launcher resumes from the saved step, at most one commit behind
    where the training stopped."""
    name = f"resumed-{cause.split('-')[0]}"
    every = nodes(cluster)
    run = checkpointed_run(
        cluster, e2e_namespace, name, tmp_path_factory.mktemp("checkpoint"), every[0]
    )
    # Its local processes (the driver, the kubelet stand-in) end with the test, failed too.
    request.addfinalizer(run.close)
    launcher = names.launcher_name(name)
    pods = Pods(cluster, e2e_namespace, name)
    first: list[dict[str, Any]] = []
    try:
        run.submit()
        run.start_launcher()
        run.wait_for_size(2, timeout=120)
        (loaded,) = run.driver_events(ev.CHECKPOINT_LOADED)
        assert loaded["step"] == 0, "a first run starts from scratch"
        old_uid = pods.get()[launcher]["metadata"]["uid"]
        time.sleep(5)  # some training
        if cause == "below-min":
            for node in every:
                cluster.kubectl("taint", "node", node, FULL, "--overwrite")
            lost_worker = names.worker_name(name, 1)
            run.kubectl("delete", "pod", lost_worker, "--grace-period=0", "--force")
        else:
            node = pods.get()[launcher]["spec"]["nodeName"]
            cluster.kubectl("taint", "node", node, f"{TAINT}=:NoSchedule", "--overwrite")

        def noticed() -> float | None:
            found = parse_notice(pods.notices().get(launcher))
            return time.time() if found is not None and found[2] == cause else None

        noticed_at = wait_for(noticed, 30, "the job-stopping notice")

        def saved() -> list[dict[str, Any]]:
            records = run.driver_events()
            if records:
                first[:] = records
            return ev.of_kind(records, ev.CHECKPOINT_SAVED)

        wait_for(saved, 20, "the checkpoint saved on the notice")
        if cause != "below-min":
            time.sleep(3)  # the training goes on, saving at every commit, until the reclaim
            saved()
            run.kubectl("delete", "pod", launcher, "--grace-period=0", "--force")

        def stopped() -> bool:
            saved()  # on kind the launcher's log goes with it: keep reading it
            found = pods.get().get(launcher)  # one read: it may go between two
            # Reading the launcher's log can outlast the gap between the force delete and
            # the controller's new launcher: a new uid means the old one stopped too.
            return (
                found is None
                or bool(found["metadata"].get("deletionTimestamp"))
                or found["metadata"]["uid"] != old_uid
            )

        wait_for(stopped, 30, "the launcher stopped after the window")
        if not IN_CLUSTER:
            run.close()  # the kubelet's SIGTERM to the driver
            first[:] = run.driver_events()
    finally:
        for node in every:
            for taint in ("example.com/full-", f"{TAINT}-"):
                cluster.kubectl("taint", "node", node, taint, check=False)
    checkpoints = ev.of_kind(first, ev.CHECKPOINT_SAVED)
    last_saved = checkpoints[-1]["step"]
    assert {c["cause"] for c in checkpoints} == {cause}
    first_saved = checkpoints[0]["ts"] - noticed_at
    resumed = resume(run, pods, old_uid)
    assert resumed[0]["step"] == last_saved > 0
    exits = ev.of_kind(first, ev.DRIVER_EXIT)
    stopped_at = exits[0]["step"] if exits else last_saved
    assert stopped_at - resumed[0]["step"] <= 1, "at most one commit lost"
    print(
        f"\nFIGURE {cause}: notice -> checkpoint written: {first_saved:.2f}s; stopped at step "
        f"{stopped_at}, resumed from {resumed[0]['step']}"
    )
    run.wait_for_size(2, timeout=120)
    run.finish()
    run.close()
    cluster.kubectl("delete", "mpijob", name, "-n", e2e_namespace, "--wait=false")

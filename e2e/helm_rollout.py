"""A controller rollout under a running elastic job, on kind: what training sees.

Run by hack/e2e-kind-helm.sh once the chart is installed. An elastic job of the mock images
(2 workers) trains; then ``helm upgrade`` with the arguments given after ``--`` rolls the
controller's Deployment (both pods replaced, one at a time, the Lease handed over). Asserted:
the upgrade rolled (new pods, a new leader, the release's next revision deployed); the
launcher and every worker are the same pods, with restartCount 0; the driver saw no
failure, no fatal event and no change to its host list while the controller rolled; and
the new leader serves the job (a scale to 3 gains the worker, the training then finishes
with exit 0). Prints the measured figures on one line (docs/operations.md quotes them).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

from e2e.harness import ElasticRun, in_cluster_job
from e2e.mockhorovod import events as ev
from mpijob_elastic.core import names
from tests.cluster import ROOT, Cluster
from tests.controller import wait_for
from tests.manifests import create_namespace

SAMPLE = ROOT / "config" / "samples" / "elastic-mpijob.yaml"
CONTROLLER_LABELS = "app.kubernetes.io/name=mpijob-elastic"
# What a controller rollout must not make the driver see: any change to its hosts or ranks.
DISTURBING = {
    *ev.FAILURE_EVENTS, *ev.FATAL_EVENTS, ev.DISCOVERY, ev.HOST_ADDED, ev.HOST_REMOVED,
    ev.RESET, ev.RANK_STARTED, ev.RANK_STOPPED, ev.RANK_EXITED, ev.RANK_UNASSIGNED,
    ev.BELOW_MIN_NP, ev.WAITING_FOR_HOSTS,
}  # fmt: skip
# How long the new leader is watched at work on the job before the pods are compared: many
# of its turns (each reads the launcher every second), all of which must leave it alone.
SETTLE_SECONDS = 10.0


def job(launcher_image: str, worker_image: str) -> dict[str, Any]:
    manifest: dict[str, Any] = yaml.safe_load(SAMPLE.read_text())
    manifest["metadata"]["name"] = "rollout"
    return in_cluster_job(manifest, launcher_image, worker_image)


def pods(cluster: Cluster, namespace: str, selector: str) -> dict[str, dict[str, Any]]:
    """Name -> (uid, restart counts) of the pods the selector picks, but those going."""
    out = cluster.kubectl("get", "pods", "-n", namespace, "-l", selector, "-o", "json").stdout
    return {
        p["metadata"]["name"]: {
            "uid": p["metadata"]["uid"],
            "restarts": sum(s["restartCount"] for s in p["status"].get("containerStatuses", [])),
        }
        for p in json.loads(out)["items"]
        if "deletionTimestamp" not in p["metadata"]
    }


def lease_holder(cluster: Cluster, namespace: str) -> str:
    out = cluster.kubectl("get", "lease", "-n", namespace, "mpijob-elastic", "-o", "json").stdout
    holder: str = json.loads(out)["spec"].get("holderIdentity", "")
    return holder.rsplit("_", 1)[0]


def revision(helm: str, kubeconfig: str, release: str, namespace: str) -> tuple[int, str]:
    out = subprocess.run(
        [helm, "--kubeconfig", kubeconfig, "status", release, "-n", namespace, "-o", "json"],
        check=True, capture_output=True, text=True,
    ).stdout  # fmt: skip
    status = json.loads(out)
    return int(status["version"]), str(status["info"]["status"])


def check(condition: bool, what: str) -> None:
    if not condition:
        raise SystemExit(f"helm_rollout: FAILED: {what}")


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="python -m e2e.helm_rollout", description=__doc__)
    for flag in ("--kubeconfig", "--kubectl", "--helm", "--release", "--namespace"):
        p.add_argument(flag, required=True)
    p.add_argument("--launcher-image", required=True)
    p.add_argument("--worker-image", required=True)
    p.add_argument("upgrade", nargs="+", help="helm upgrade's arguments after the release")
    args = p.parse_args(argv)
    cluster = Cluster(args.kubeconfig, args.kubectl)
    system = args.namespace
    where = create_namespace(cluster)
    run = ElasticRun(
        cluster,
        where,
        job(args.launcher_image, args.worker_image),
        Path(tempfile.mkdtemp(prefix="helm-rollout-")),
        in_cluster=True,
    )
    try:
        return rollout(args, cluster, system, run)
    finally:
        run.close()
        cluster.kubectl("delete", "namespace", where, "--wait=false", check=False)


def rollout(args: argparse.Namespace, cluster: Cluster, system: str, run: ElasticRun) -> int:
    run.submit()
    run.start_launcher(timeout=120)
    run.wait_for_ranks_on(2, timeout=180)
    of_job = f"{names.LABEL_JOB}={run.job}"
    before = pods(cluster, run.namespace, of_job)
    controllers = set(pods(cluster, system, CONTROLLER_LABELS))
    leader = lease_holder(cluster, system)
    old_revision, _ = revision(args.helm, args.kubeconfig, args.release, system)
    hosts_before = run.discovered()
    events_before = len(run.driver_events())

    start = time.time()
    subprocess.run(
        [args.helm, "--kubeconfig", args.kubeconfig, "upgrade", args.release, *args.upgrade],
        check=True, stdout=sys.stderr,
    )  # fmt: skip
    cluster.kubectl(
        "rollout", "status", "-n", system, "deployment/mpijob-elastic", "--timeout=300s"
    )
    rolled = time.time() - start
    now = set(pods(cluster, system, CONTROLLER_LABELS))
    new_leader = wait_for(
        lambda: (h := lease_holder(cluster, system)) in now and h, 60, "a new pod leading"
    )
    new_revision, status = revision(args.helm, args.kubeconfig, args.release, system)
    check(new_revision == old_revision + 1 and status == "deployed", f"revision {status}")
    check(not now & controllers, f"the rollout kept pods {sorted(now & controllers)}")
    time.sleep(SETTLE_SECONDS)

    # What the driver saw while the controller rolled: nothing of its hosts or ranks.
    during = [e["event"] for e in run.driver_events()[events_before:]]
    check(not DISTURBING & set(during), f"the driver saw {during} during the rollout")
    check(run.discovered() == hosts_before, f"hosts {hosts_before} -> {run.discovered()}")
    after = pods(cluster, run.namespace, of_job)
    check(after == before, f"the job's pods changed: {before} -> {after}")
    check(all(p["restarts"] == 0 for p in after.values()), f"restarts: {after}")

    # The new leader serves the job: it grows, then the training ends well.
    run.scale(3)
    run.wait_for_ranks_on(3, timeout=120)
    bad = run.driver_events(*ev.FAILURE_EVENTS, *ev.FATAL_EVENTS)
    check(bad == [], f"failures: {bad}")
    restarts = sum(p["restarts"] for p in pods(cluster, run.namespace, of_job).values())
    check(restarts == 0, f"{restarts} restarts after the scale-up")
    code = run.finish(timeout=120)
    check(code == 0, f"the driver exited {code}")
    print(
        f"rollout {rolled:.1f}s (revision {old_revision} -> {new_revision}, "
        f"{len(controllers)} controller pods replaced, leader {leader} -> {new_leader}); "
        f"launcher and {len(before) - 1} workers kept, restarts 0, rank failures 0, "
        f"driver events during it: {sorted(set(during)) or 'none'}, hosts {hosts_before} "
        f"unchanged; then scaled to 3 by the new leader, restarts 0, driver exit {code}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""`make demo`: an elastic MPIJob scaled 2 -> 4 -> 1 -> 3 on a local cluster, then a node
with workers drained, a spot reclaim notice reaching the training, then grown into
idle GPUs and preempted by a higher-priority job, explained.

python -m e2e.demo [--keep]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path
from typing import Any

import yaml

from e2e.harness import DRIVER_ARGS, ElasticRun, Step, describe_moves, spread_workers
from e2e.mockhorovod import events as ev
from mpijob_elastic.core import names
from tests.cluster import HACK, ROOT, Cluster, binaries_dir
from tests.controller import ControllerProcess, wait_for

CLUSTER = "mpijob-elastic-demo"
NAMESPACE = "demo"
DRAIN_SECONDS = 15


def say(text: str = "") -> None:
    print(textwrap.dedent(text).strip("\n") if text else "", flush=True)


def section(title: str) -> None:
    print(f"\n\033[1m{title}\033[0m" if sys.stdout.isatty() else f"\n{title}", flush=True)


def show_state(run: ElasticRun, step: Step, since: str = "the edit") -> None:
    pods = json.loads(
        run.kubectl("get", "pods", "-l", names.selector(run.job, "worker"), "-o", "json")
    )
    print("  worker pods:")
    for pod in sorted(pods["items"], key=lambda p: int(p["metadata"]["name"].rsplit("-", 1)[1])):
        meta = pod["metadata"]
        state = pod.get("status", {}).get("phase", "?")
        if meta.get("deletionTimestamp"):
            state += ", terminating"
        if names.ANN_DRAINING_SINCE in (meta.get("annotations") or {}):
            state += ", draining (out of discover_hosts.sh, deleted once its ranks left)"
        node = pod["spec"].get("nodeName") or "-"
        print(f"    {meta['name']:28} {node:12} {state}")
    script = (run.etc_mpi / names.DISCOVER_HOSTS).read_text()
    print("  /etc/mpi/discover_hosts.sh, as the launcher sees it:")
    for line in script.splitlines():
        print(f"    {line}")
    print(f"  what happened, in seconds since {since}:")
    for offset, text in run.timeline(step):
        print(f"    +{offset:5.2f}s  {text}")
    failures = len(run.driver_events(ev.RANK_FAILED))
    blacklisted = [e["host"] for e in run.driver_events(ev.HOST_BLACKLISTED)]
    print(
        f"  Horovod's view: ranks on {len(run.ranks_running_on())} hosts; "
        f"{failures} failures, blacklisted: {', '.join(blacklisted) or 'none'}"
    )


def sample() -> dict[str, Any]:
    job: dict[str, Any] = yaml.safe_load((ROOT / "config/samples/elastic-mpijob.yaml").read_text())
    job["metadata"]["annotations"][names.ANN_DRAIN_SECONDS] = str(DRAIN_SECONDS)
    # A node reclaimed then takes one worker, not the whole job (step 7).
    return spread_workers(job)


def demo(cluster: Cluster, workdir: Path) -> None:
    cluster.kubectl("apply", "-k", str(ROOT / "config/crd"))
    cluster.wait_established("mpijobs.kubeflow.org")
    cluster.kubectl("apply", "-k", str(ROOT / "config/admission"))
    cluster.kubectl("create", "namespace", NAMESPACE, check=False)
    # Pods cannot be created in a namespace before its default ServiceAccount exists.
    cluster.kubectl("wait", "--for=create", "serviceaccount/default", "-n", NAMESPACE)
    section("1. The controller")
    controller = ControllerProcess(cluster, (NAMESPACE,), workdir / "controller.log")
    controller.start()
    say(f"""
        mpijob-elastic runs as a local process watching namespace '{NAMESPACE}' (its log:
        {workdir / "controller.log"}). The MPIJob CRD has a scale subresource, and a
        ValidatingAdmissionPolicy keeps Worker replicas within the job's bounds.
    """)
    # The mock training keeps a checkpoint, saved on a job-stopping notice (step 8).
    checkpoint = ("--checkpoint-file", str(workdir / "checkpoint"))
    run = ElasticRun(
        cluster, NAMESPACE, sample(), workdir / "launcher", driver_args=DRIVER_ARGS + checkpoint
    )
    try:
        _submit_and_grow(run)
        _shrink_and_regrow(run)
        _refuse(cluster, run)
        _drain_node(run)
        _notice(run)
        _idle_capacity(cluster, run)
        _finish(run)
    finally:
        run.close()
        controller.stop()


def _submit_and_grow(run: ElasticRun) -> None:
    """Sections 2 and 3: the job starts, then grows."""
    section("2. Submit the sample elastic MPIJob (config/samples/elastic-mpijob.yaml)")
    say(f"""
        2 workers, bounds 1..5 (annotations {names.ANN_MIN_REPLICAS} and
        {names.ANN_MAX_REPLICAS}), drain {DRAIN_SECONDS}s. Its launcher runs
          horovodrun -np 2 --min-np 1 --max-np 5 \\
            --host-discovery-script /etc/mpi/discover_hosts.sh ...
        Here a mock of Horovod's elastic driver plays the launcher: it runs
        discover_hosts.sh every second and starts ranks through kubexec.sh (kubectl exec,
        as the launcher's ServiceAccount, so RBAC is checked for real).
    """)
    step = run.submit()
    run.start_launcher()
    run.wait_for_ranks_on(2)
    show_state(run, step)

    section("3. Scale up to 4: kubectl patch ... Worker.replicas: 4")
    say("""
        The controller grants the launcher exec on the new workers first, creates them,
        and lists each in discover_hosts.sh once it runs. It annotates the launcher pod
        so the kubelet refreshes the mounted file now, not in a minute.
    """)
    step = run.scale(4)
    run.wait_for_ranks_on(4)
    show_state(run, step)


def _shrink_and_regrow(run: ElasticRun) -> None:
    """Sections 4 and 5: a scale-in drains, a scale-up reuses the names."""
    section("4. Scale in to 1: kubectl patch ... Worker.replicas: 1")
    say(f"""
        The surplus workers leave discover_hosts.sh first. Horovod sees hosts leave the
        discovery output and lets them go gracefully at their next commit: no failure,
        no blacklist. The launcher's kubexec.sh reports each remote shell's exit, and
        the controller deletes each pod once its rank has left, a few seconds in, not
        after the whole
        {DRAIN_SECONDS}s drain bound. (Upstream controllers deleted them while still
        listed: a failure in Horovod's eyes, and a blacklisted name.)
    """)
    step = run.scale(1)
    run.wait_for_ranks_on(1)
    time.sleep(1)
    say("  one second later:")
    show_state(run, step)
    wait_for(lambda: run.worker_pods() == run.hosts(1), 30, "the drain")
    say(f"  once their ranks had left ({time.time() - step.started:.1f}s after the edit):")
    show_state(run, step)

    section("5. Scale back to 3: kubectl scale mpijob/elastic-horovod --replicas=3")
    say("""
        Names are reused (worker-1, worker-2). Since they left gracefully, none was
        blacklisted, so Horovod takes them all back.
    """)
    step = run.scale(3, via="scale")
    run.wait_for_ranks_on(3)
    show_state(run, step)


def _refuse(cluster: Cluster, run: ElasticRun) -> None:
    """Section 6: the admission policy refuses a size outside the bounds."""
    section("6. An edit outside the bounds is refused")
    refused = cluster.kubectl(
        "scale", f"mpijob/{run.job}", "-n", NAMESPACE, "--replicas=9", check=False
    )
    say(f"  kubectl scale --replicas=9 -> {refused.stderr.strip()}")


def _drain_node(run: ElasticRun) -> None:
    """Section 7: kubectl drain moves the workers on a node."""
    section("7. A node goes away: kubectl drain")
    node, selector = run.node_to_drain()
    before = run.worker_nodes()
    leaving = {w: n for w, n in before.items() if n == node}
    # Indented as the text below, which say() dedents as a whole.
    only = f" \\\n{' ' * 12}--pod-selector={selector}" if selector else ""
    say(f"""
        A node is emptied, for maintenance or before a spot node is reclaimed:
          kubectl drain {node} --ignore-daemonsets --delete-emptydir-data --force \\
            --timeout=120s{only}
        It cordons the node and evicts its pods, here {", ".join(sorted(leaving))}.
        The controller sees the cordon and creates a replacement elsewhere at once. An
        evicted worker (deleted with a grace period) leaves discover_hosts.sh at once,
        and the default worker command keeps its rank alive until it leaves at its next
        commit, so Horovod removes the host gracefully: no failure, no blacklist. The
        job's PodDisruptionBudget (minAvailable = min-replicas) makes kubectl drain wait
        rather than take the job below its minimum.
    """)
    say("  the job's disruption budget (kubectl get pdb):")
    for line in run.kubectl("get", "pdb").splitlines():
        print(f"    {line}")
    step = run.begin(f"kubectl drain {node}")
    try:
        drained = run.drain(step, node, selector)
        for line in drained.output.splitlines():
            print(f"    {line}")
        run.wait_for_size(3)
        wait_for(lambda: not set(leaving) & set(run.worker_pods()), 30, "the evicted pods")
        show_state(run, step, since="the drain")
        placement = run.worker_nodes()
        say("  the workers that left and their replacements, in seconds since the drain:")
        for line in describe_moves(run.moves(step, leaving), run.arrivals(step, set(before))):
            print(f"    {line}")
    finally:
        run.kubectl("uncordon", node)
    still = sum(n == node for n in placement.values())
    say(f"""
        The job runs {len(placement)} workers, {still or "none"} of them on {node}
        (uncordoned again now).
    """)


def _notice(run: ElasticRun) -> None:
    """Section 8: a spot reclaim notice on the launcher's node reaches the training."""
    section("8. A spot reclaim notice: the training hears first")
    node = run.launcher_node()
    assert node is not None
    taint = "aws-node-termination-handler/spot-itn"
    say(f"""
        The launcher's node {node} gets the AWS node termination handler's spot
        interruption taint: in about 2 minutes the node is reclaimed, and the launcher,
        Horovod's driver, with it. Horovod's in-memory state does not survive that. The
        controller gives every pod of the job a job-stopping notice, the annotation
        {names.ANN_NOTICE}, which the kubelet writes to {names.NOTICE_MOUNT}/notice in
        the containers; rank 0 saves a checkpoint on it
        (contrib/mpijob_elastic_notice.py: should_checkpoint()). Here the mock driver
        plays rank 0 and the kubelet stand-in writes the file.
          kubectl taint node {node} {taint}=:NoSchedule
    """)
    step = run.begin(f"kubectl taint node {node} {taint}")
    launcher = names.launcher_name(run.job)
    try:
        run.kubectl("taint", "node", node, f"{taint}=:NoSchedule")
        saved = wait_for(lambda: run.driver_events(ev.CHECKPOINT_SAVED), 30, "the checkpoint")
        pod = json.loads(run.kubectl("get", "pod", launcher, "-o", "json"))
        notice = pod["metadata"]["annotations"][names.ANN_NOTICE]
        print(f"  the launcher's notice:    {notice}")
        print(f"  the file the driver read: {run.notice_file.read_text()}")
        print(
            f"  checkpoint saved: step {saved[0]['step']}, "
            f"{saved[0]['ts'] - step.started:.2f}s after the taint"
        )
    finally:
        run.kubectl("taint", "node", node, f"{taint}-", check=False)
    wait_for(lambda: not run.notice_file.read_text(), 30, "the notice removed")
    say("""
        The node stays after all (the taint is removed): the notice is removed, and the
        file is empty again. Had it gone, the restarted launcher would resume from the
        saved step, losing at most the steps of one commit interval
        (e2e/test_notices.py, docs/spot.md).
    """)


def _idle_capacity(cluster: Cluster, run: ElasticRun) -> None:
    """Section 9: the job grows into idle GPUs, a higher-priority job takes them back."""
    section("9. Idle capacity: opportunistic workers (docs/capacity.md)")
    say(f"""
        kubectl annotate mpijob/{run.job} {names.ANN_OPPORTUNISTIC}=true, and new workers
        ask for a GPU each (a template edit reaches new pods only). Worker replicas (3) is
        now the baseline; the controller adds workers above it, up to max-replicas (5),
        while the scheduler has room, at the PriorityClass mpijob-elastic-opportunistic
        (value -100, preemptionPolicy Never), which config/default ships.
    """)
    cluster.kubectl("apply", "-f", str(ROOT / "config/default/priority_class.yaml"))
    job = json.loads(run.kubectl("get", "mpijob", run.job, "-o", "json"))
    containers = job["spec"]["mpiReplicaSpecs"]["Worker"]["template"]["spec"]["containers"]
    for container in containers:
        container["resources"] = {"limits": {"nvidia.com/gpu": "1"}}
    # A merge patch replaces a list whole: the containers go in full.
    patch = {
        "metadata": {"annotations": {names.ANN_OPPORTUNISTIC: "true"}},
        "spec": {"mpiReplicaSpecs": {"Worker": {"template": {"spec": {
            "containers": containers
        }}}}},
    }  # fmt: skip
    step = run.begin("kubectl annotate: opportunistic")
    run.kubectl("patch", "mpijob", run.job, "--type=merge", "-p", json.dumps(patch))
    run.wait_for_size(5)
    show_state(run, step)
    for line in run.kubectl("get", "mpijob", run.job, "-o", "wide").splitlines():
        print(f"    {line}")
    grown = json.loads(
        run.kubectl("get", "pods", "-l", f"{names.LABEL_OPPORTUNISTIC}=true", "-o", "json")
    )["items"]
    nodes = sorted({p["spec"]["nodeName"] for p in grown})
    say(f"""
        A training job of higher priority (priority 0, the default) arrives and needs
        every GPU of {", ".join(nodes)}. The scheduler preempts the opportunistic workers
        there: they leave discover_hosts.sh at once and Horovod lets their ranks go at
        the next commit. Growth backs off, so the job does not grab the room back.
    """)
    step = run.begin("a higher-priority job arrives")
    for i, node in enumerate(nodes):
        run.kubectl("apply", "-f", "-", input=json.dumps(_whole_node(f"high-{i}", node)))
    try:
        run.wait_for_size(5 - len(grown), timeout=90)
        wait_for(
            lambda: all(
                '"Running"' in run.kubectl("get", "pod", f"high-{i}", "-o", "jsonpath={.status}")
                for i in range(len(nodes))
            ),
            60,
            "the higher-priority pods running",
        )
        show_state(run, step, since="the higher-priority job arrived")
        for line in run.kubectl(
            "get", "events", "--field-selector", f"involvedObject.name={run.job}"
        ).splitlines():
            if any(r in line for r in ("Grew", "Preempted", "NAME")):
                print(f"    {line[:150]}")
    finally:
        run.kubectl("delete", "pod", *(f"high-{i}" for i in range(len(nodes))), "--wait=false")


GPUS_8 = {"nvidia.com/gpu": "8"}


def _whole_node(name: str, node: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "nodeSelector": {"kubernetes.io/hostname": node},
            "containers": [
                {
                    "name": "main",
                    "image": "busybox",
                    "resources": {"limits": {"nvidia.com/gpu": "8"}},
                }
            ],
        },
    }


def _finish(run: ElasticRun) -> None:
    """Section 9: the job succeeds."""
    section("9. The training finishes")
    code = run.finish()
    wait_for(lambda: "Succeeded" in run.kubectl("get", "mpijob", run.job), 30, "Succeeded")
    say(f"  The driver exited {code}, so the launcher pod ended, and the job:")
    for line in run.kubectl("get", "mpijob", run.job).splitlines():
        print(f"    {line}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--keep", action="store_true", help="leave the cluster up afterwards")
    args = parser.parse_args()
    section("0. A local Kubernetes cluster")
    say("""
        Real kube-apiserver, etcd, controller-manager and scheduler, with KWOK playing the
        kubelet for 4 fake GPU nodes, all as local processes. The first run builds them from
        Go modules (a few minutes, with progress); later runs start in seconds.
    """)
    bin_dir = binaries_dir()
    env = dict(os.environ, MPIJOB_ELASTIC_CLUSTER=CLUSTER)
    up = subprocess.run(
        [str(HACK / "cluster-up.sh")], env=env, check=True, stdout=subprocess.PIPE, text=True
    )
    kubeconfig = up.stdout.strip().splitlines()[-1]
    cluster = Cluster(kubeconfig, str(bin_dir / "kubectl"))
    print(cluster.kubectl("get", "nodes").stdout)
    try:
        with tempfile.TemporaryDirectory(prefix="mpijob-elastic-demo-") as tmp:
            demo(cluster, Path(tmp))
    finally:
        if args.keep:
            section("The cluster is still up")
            say(f"""
                export KUBECONFIG={kubeconfig}
                export PATH={bin_dir}:$PATH
                kubectl get mpijobs,pods -n {NAMESPACE}
                # the controller again:
                mpijob-elastic run --namespaces {NAMESPACE} --kubectl-delivery none
                # when done:
                MPIJOB_ELASTIC_CLUSTER={CLUSTER} make cluster-down
            """)
        else:
            subprocess.run([str(HACK / "cluster-down.sh")], env=env, check=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())

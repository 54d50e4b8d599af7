"""Benchmark on kind: scale-in edit → victim pod gone, with the launcher read and without.

One elastic job of the mock images (e2e/images) runs the mock Horovod driver in its
launcher, committing every second; the controller is the one `config/default` installed
(hack/e2e-kind.sh with KEEP_CLUSTER=1, or `make bench-kind-drain`). Each cycle scales 4 → 1
and takes, for each of the 3 victims, the time from the edit's answer to the pod gone from
the API; then back to 4 and waits for ranks on all four.

Two variants on the same cluster, one after the other:

* ``read``: the driver's remote shell is /etc/mpi/kubexec.sh, so the controller sees in the
  launcher when a victim's rank has left and deletes it then (docs/membership.md);
* ``fixed``: the same script copied to /tmp/rsh, which the controller does not recognise:
  the signal cannot be read, and the drain runs its full ``drain-seconds`` (30 s, the
  default), which is what every drain did before.

    python -m bench.kind_drain --kubeconfig FILE --launcher-image IMG --worker-image IMG
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

from e2e.harness import ElasticRun, in_cluster_job
from mpijob_elastic.core import names
from tests.cluster import ROOT, Cluster

SAMPLE = ROOT / "config" / "samples" / "elastic-mpijob.yaml"
DRAIN_SECONDS = 30


def job(name: str, launcher_image: str, worker_image: str, fixed: bool) -> dict[str, Any]:
    manifest: dict[str, Any] = yaml.safe_load(SAMPLE.read_text())
    manifest["metadata"]["name"] = name
    manifest["metadata"]["annotations"][names.ANN_DRAIN_SECONDS] = str(DRAIN_SECONDS)
    in_cluster_job(manifest, launcher_image, worker_image)
    launcher = manifest["spec"]["mpiReplicaSpecs"]["Launcher"]["template"]["spec"]
    container = launcher["containers"][0]
    command = container["command"] + ["--commit-interval", "1"]
    if fixed:
        command += ["--rsh-agent", "/tmp/rsh"]
        container["command"] = [
            "/bin/sh",
            "-c",
            'cp /etc/mpi/kubexec.sh /tmp/rsh && exec "$@"',
            "sh",
            *command,
        ]
    else:
        container["command"] = command
    return manifest


def cycle(run: ElasticRun) -> list[float]:
    kept = {names.worker_name(run.job, 0)}
    before = set(run.worker_pods())
    step = run.scale(1)
    victims = before - kept
    gone: dict[str, float] = {}
    while len(gone) < len(victims):
        now = set(run.worker_pods())
        for victim in victims - now - set(gone):
            gone[victim] = time.time() - step.started
        if time.time() - step.started > DRAIN_SECONDS + 60:
            raise TimeoutError(f"victims {sorted(victims - set(gone))} never went")
        time.sleep(0.1)
    run.scale(4)
    run.wait_for_ranks_on(4, timeout=120)
    return sorted(gone.values())


def measure(cluster: Cluster, args: argparse.Namespace, fixed: bool) -> list[float]:
    namespace = f"bench-drain-{'fixed' if fixed else 'read'}-{int(time.time())}"
    cluster.kubectl("create", "namespace", namespace)
    try:
        manifest = job("drain", args.launcher_image, args.worker_image, fixed)
        manifest["spec"]["mpiReplicaSpecs"]["Worker"]["replicas"] = 4
        run = ElasticRun(cluster, namespace, manifest, Path(tempfile.mkdtemp()), in_cluster=True)
        try:
            run.submit()
            run.start_launcher()
            run.wait_for_ranks_on(4, timeout=180)
            samples: list[float] = []
            for _ in range(args.cycles):
                samples += cycle(run)
            return samples
        finally:
            run.close()
    finally:
        cluster.kubectl("delete", "namespace", namespace, "--wait=false", check=False)


def describe(samples: list[float]) -> str:
    return (
        f"n={len(samples)} p50 {statistics.median(samples):.2f}s "
        f"min {min(samples):.2f}s max {max(samples):.2f}s"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--kubeconfig", required=True)
    parser.add_argument("--kubectl", default="kubectl")
    parser.add_argument("--launcher-image", required=True)
    parser.add_argument("--worker-image", required=True)
    parser.add_argument("--cycles", type=int, default=3)
    args = parser.parse_args()
    cluster = Cluster(args.kubeconfig, args.kubectl)
    read = measure(cluster, args, fixed=False)
    print(f"launcher read (ends when the ranks left): {describe(read)}", flush=True)
    fixed = measure(cluster, args, fixed=True)
    print(f"fixed drain ({DRAIN_SECONDS}s, signal unreadable): {describe(fixed)}", flush=True)
    print("| edit → victim pod gone, 4 → 1, commits every 1 s | p50 | min | max |")
    print("|---|---|---|---|")
    for label, samples in (("ends when the ranks left", read), ("fixed drain 30 s", fixed)):
        print(
            f"| {label} ({len(samples)} victims) | {statistics.median(samples):.2f} s "
            f"| {min(samples):.2f} s | {max(samples):.2f} s |"
        )


if __name__ == "__main__":
    main()

"""Benchmark on kind: a ConfigMap change → the file a pod mounts from it changes.

What the launcher of an elastic job lives on: the controller rewrites ``<job>-config`` and
then annotates the launcher pod (``mpijob-elastic.io/config-hash``), because a pod update
makes the kubelet sync the pod, and with it the ConfigMap volume, at once; without that the
change waits for the kubelet's periodic resync (about a minute plus its cache delay).

Each sample is one pod of the mock worker image mounting a ConfigMap of its own at
/etc/mpi (a directory mount, as the launcher's) and printing the time whenever the
mounted discover_hosts.sh changes. The benchmark writes the ConfigMap the way the
controller does (a full update, then, in the "with" case, the same merge patch of the
same annotation) and takes the time between the write's answer and the pod's line: one
clock, since kind's containers share this machine's kernel. Samples without the
annotation run side by side (each waits for its own kubelet resync), so that case takes
about two minutes instead of twenty.

    python -m bench.kind_refresh --kubeconfig FILE --image WORKER_IMAGE [--samples 20]

``make bench-kind`` brings up the cluster and the images first.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import statistics
import subprocess
import time
import uuid

from mpijob_elastic.core import names

WATCHER = """
import hashlib, sys, time
path = "/etc/mpi/discover_hosts.sh"
last = None
while True:
    try:
        data = open(path, "rb").read()
    except OSError:
        data = b""
    if data != last:
        last = data
        print(f"{time.time():.3f} {hashlib.sha1(data).hexdigest()[:12]}", flush=True)
    time.sleep(0.02)
"""


class Kind:
    def __init__(self, kubeconfig: str, namespace: str) -> None:
        self.kubeconfig = kubeconfig
        self.namespace = namespace

    def kubectl(self, *args: str, input: str | None = None) -> str:
        cmd = ["kubectl", "--kubeconfig", self.kubeconfig, "-n", self.namespace, *args]
        done = subprocess.run(cmd, capture_output=True, text=True, input=input)
        if done.returncode:
            raise RuntimeError(f"kubectl {' '.join(args)}: {done.stderr.strip()}")
        return done.stdout


def content(round_: int) -> str:
    return f"#!/bin/sh\necho bench-worker-{round_}:1"


def config_map(name: str, data: str) -> dict[str, object]:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": name},
        "data": {names.DISCOVER_HOSTS: data},
    }


def pod(name: str, image: str) -> dict[str, object]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": {"app": "kind-refresh-bench"}},
        "spec": {
            "terminationGracePeriodSeconds": 0,
            "containers": [
                {
                    "name": "watch",
                    "image": image,
                    "imagePullPolicy": "IfNotPresent",
                    "command": ["/usr/local/bin/python3", "-c", WATCHER],
                    "volumeMounts": [{"name": "mpi", "mountPath": names.CONFIG_MOUNT}],
                }
            ],
            "volumes": [{"name": "mpi", "configMap": {"name": name}}],
        },
    }


def sha(data: str) -> str:
    return hashlib.sha1(data.encode()).hexdigest()[:12]


def seen_at(k: Kind, pod_name: str, digest: str) -> float | None:
    for line in k.kubectl("logs", pod_name).splitlines():
        ts, _, got = line.partition(" ")
        if got == digest:
            return float(ts)
    return None


def wait_seen(k: Kind, pods: list[str], digest: str, timeout: float) -> dict[str, float]:
    """When each pod first showed the content of this digest."""
    deadline = time.monotonic() + timeout
    seen: dict[str, float] = {}
    while len(seen) < len(pods):
        if time.monotonic() > deadline:
            raise TimeoutError(f"{sorted(set(pods) - set(seen))} never showed {digest}")
        for p in set(pods) - set(seen):
            at = seen_at(k, p, digest)
            if at is not None:
                seen[p] = at
        time.sleep(0.2)
    return seen


def update(k: Kind, name: str, data: str) -> float:
    """Replace the ConfigMap's data (as the controller's full update does); when it landed."""
    obj = json.loads(k.kubectl("get", "configmap", name, "-o", "json"))
    obj["data"] = {names.DISCOVER_HOSTS: data}
    k.kubectl("replace", "-f", "-", input=json.dumps(obj))
    return time.time()


def summary(label: str, delays: list[float]) -> str:
    delays = sorted(delays)
    return (
        f"{label}: n={len(delays)} p50 {statistics.median(delays):.2f} s, "
        f"min {delays[0]:.2f} s, max {delays[-1]:.2f} s"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kubeconfig", required=True)
    parser.add_argument("--image", required=True, help="an image with /usr/local/bin/python3")
    parser.add_argument("--samples", type=int, default=20)
    parser.add_argument("--timeout", type=float, default=240, help="per unannotated change")
    args = parser.parse_args()
    ns = f"bench-{uuid.uuid4().hex[:8]}"
    subprocess.run(
        ["kubectl", "--kubeconfig", args.kubeconfig, "create", "namespace", ns],
        check=True,
        capture_output=True,
    )
    k = Kind(args.kubeconfig, ns)
    try:
        pods = [f"refresh-{i}" for i in range(args.samples)]
        items = [config_map(p, content(0)) for p in pods] + [pod(p, args.image) for p in pods]
        # Pods need the namespace's default ServiceAccount, which comes a moment later.
        k.kubectl("wait", "--for=create", "serviceaccount/default", "--timeout=60s")
        k.kubectl(
            "create",
            "-f",
            "-",
            input=json.dumps({"apiVersion": "v1", "kind": "List", "items": items}),
        )
        k.kubectl("wait", "--for=condition=Ready", "pod", "--all", "--timeout=180s")
        wait_seen(k, pods, sha(content(0)), 60)

        # With the annotation: one change at a time, as the controller makes them.
        with_ann: list[float] = []
        for i, p in enumerate(pods, start=1):
            data = content(i)
            written = update(k, p, data)
            patch = {"metadata": {"annotations": {names.ANN_CONFIG_HASH: sha(data)}}}
            k.kubectl("patch", "pod", p, "--type=merge", "-p", json.dumps(patch))
            with_ann.append(wait_seen(k, [p], sha(data), 60)[p] - written)
        print(summary("ConfigMap write -> mounted file, launcher pod annotated", with_ann))

        # Without it: every ConfigMap changes at once, nobody touches the pods.
        data = content(10_000)
        written_at = {p: update(k, p, data) for p in pods}
        seen = wait_seen(k, pods, sha(data), args.timeout)
        without = [seen[p] - written_at[p] for p in pods]
        print(summary("ConfigMap write -> mounted file, no pod update", without))
    finally:
        subprocess.run(
            ["kubectl", "--kubeconfig", args.kubeconfig, "delete", "namespace", ns, "--wait=false"],
            check=False,
            capture_output=True,
        )


if __name__ == "__main__":
    main()

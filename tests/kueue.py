"""Pytest fixture that runs a real Kueue (its manager, built from its Go module by
hack/build-kueue.sh) as a local process against the local cluster, with its CRDs from the
same module.

Kueue runs as Kueue's docs deploy it for an external framework (docs/scheduling.md,
"Kueue"): `kubeflow.org/mpijob` (MPI Operator v2's v2beta1) left out of
`integrations.frameworks`, `MPIJob.v1.kubeflow.org` listed in `externalFrameworks`. Its
admission webhooks are not registered with the API server: the Workloads this controller
writes are complete, so nothing needs Kueue's defaulting, and the API server then needs no
route to a process outside the cluster. The webhook server still starts (controller-runtime
starts it with the manager), on a free port with a self-signed certificate.
"""

from __future__ import annotations

import functools
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.cluster import HACK, Cluster
from tests.controller import free_port, stop_process, wait_for

# The visibility server (an aggregated API) is not needed; workload slices are what elastic
# jobs grow by (docs/scheduling.md, "Kueue"; the controller's --kueue-workload-slices).
FEATURE_GATES = "VisibilityOnDemand=false,ElasticJobsViaWorkloadSlices=true"


@dataclass
class Kueue:
    proc: subprocess.Popen[bytes]
    log_path: Path

    def logs(self) -> str:
        return self.log_path.read_text(errors="replace")


def _build(what: str) -> str:
    out = subprocess.run(
        [str(HACK / "build-kueue.sh"), what], check=True, stdout=subprocess.PIPE, text=True
    )
    return out.stdout.strip().splitlines()[-1]


def configuration(cert_dir: Path) -> dict[str, Any]:
    return {
        "apiVersion": "config.kueue.x-k8s.io/v1beta2",
        "kind": "Configuration",
        "namespace": "kueue-system",
        "health": {"healthProbeBindAddress": f"127.0.0.1:{free_port()}"},
        "metrics": {"bindAddress": "0"},
        "webhook": {"port": free_port(), "host": "127.0.0.1", "certDir": str(cert_dir)},
        "leaderElection": {"leaderElect": False},
        "internalCertManagement": {"enable": False},
        # Short, so a job whose Workload never got PodsReady would be evicted within a test.
        "waitForPodsReady": {"timeout": "15s", "blockAdmission": False},
        "integrations": {
            # Kueue's own MPIJob integration speaks v2beta1 of the same group and kind.
            "frameworks": ["batch/job"],
            "externalFrameworks": ["MPIJob.v1.kubeflow.org"],
        },
    }


def _certificate(cert_dir: Path) -> None:
    cert_dir.mkdir(parents=True, exist_ok=True)
    subprocess.run(
        [
            "openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
            "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1",
            "-keyout", str(cert_dir / "tls.key"), "-out", str(cert_dir / "tls.crt"),
        ],
        check=True,
        capture_output=True,
    )  # fmt: skip


@pytest.fixture(scope="session")
def kueue(cluster: Cluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Kueue]:
    binary = _build("binary")
    crds = _build("crds")
    cluster.kubectl("apply", "--server-side", "-f", crds)

    def established(crd: str) -> bool:
        # Right after the apply the CRD may have no status yet, which `kubectl wait` rejects.
        return (
            cluster.kubectl(
                "wait", "--for=condition=Established", f"crd/{crd}.kueue.x-k8s.io",
                "--timeout=10s", check=False,
            ).returncode
            == 0
        )  # fmt: skip

    for crd in ("workloads", "clusterqueues", "localqueues", "resourceflavors"):
        wait_for(functools.partial(established, crd), timeout=60, what=f"CRD {crd} established")
    cluster.kubectl("create", "namespace", "kueue-system", check=False)
    home = tmp_path_factory.mktemp("kueue")
    _certificate(home / "certs")
    config = home / "config.yaml"
    config.write_text(yaml.safe_dump(configuration(home / "certs")))
    # Outside pytest's temporary directories, which other sessions on the machine prune.
    log_path = Path(tempfile.mkdtemp(prefix="kueue-log-")) / "kueue.log"
    # Without its internal certificate management (which would wait for webhook
    # configurations this setup does not register) Kueue reads its metrics certificate from
    # a fixed path, /etc/kueue/metrics/certs: it gets one there in a mount namespace of its
    # own, over an overlay of /etc, so the machine's /etc is not touched.
    upper, work = home / "etc", home / "etc-work"
    upper.mkdir()
    work.mkdir()
    certs = home / "certs"
    script = (
        f"mount -t overlay overlay -o lowerdir=/etc,upperdir={upper},workdir={work} /etc"
        f" && mkdir -p /etc/kueue/metrics && cp -r {certs} /etc/kueue/metrics/certs"
        f' && exec "$0" "$@"'
    )
    with log_path.open("wb") as log:
        proc = subprocess.Popen(
            [
                "unshare",
                "--mount",
                "--propagation",
                "private",
                "sh",
                "-c",
                script,
                binary,
                f"--config={config}",
                f"--feature-gates={FEATURE_GATES}",
            ],
            env={"KUBECONFIG": cluster.kubeconfig, "PATH": "/usr/bin:/bin"},
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    running = Kueue(proc, log_path)
    try:
        wait_for(
            lambda: "Starting workers" in running.logs() or proc.poll() is not None,
            timeout=120,
            what="Kueue's controllers to start",
        )
        assert proc.poll() is None, f"Kueue exited:\n{running.logs()[-5000:]}"
        yield running
    finally:
        stop_process(proc)
        print(f"--- Kueue log: {log_path} ---\n{running.logs()[-20000:]}")
        # Other tests of the session share the cluster: leave it without Kueue's API.
        cluster.kubectl("delete", "--wait=false", "-f", crds, check=False)

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


def feature_gates(slices: bool) -> str:
    """The visibility server (an aggregated API) is not needed; workload slices are what
    elastic jobs grow by when on (docs/scheduling.md, "Kueue"; the controller's
    --kueue-workload-slices), Kueue's default since v0.18."""
    return f"VisibilityOnDemand=false,ElasticJobsViaWorkloadSlices={str(slices).lower()}"


@dataclass
class Kueue:
    proc: subprocess.Popen[bytes]
    log_path: Path
    slices: bool

    def logs(self) -> str:
        return self.log_path.read_text(errors="replace")


def _build(what: str) -> str:
    out = subprocess.run(
        [str(HACK / "build-kueue.sh"), what], check=True, stdout=subprocess.PIPE, text=True
    )
    return out.stdout.strip().splitlines()[-1]


def configuration(cert_dir: Path, pods_ready_timeout: str) -> dict[str, Any]:
    return {
        "apiVersion": "config.kueue.x-k8s.io/v1beta2",
        "kind": "Configuration",
        "namespace": "kueue-system",
        "health": {"healthProbeBindAddress": f"127.0.0.1:{free_port()}"},
        "metrics": {"bindAddress": "0"},
        "webhook": {"port": free_port(), "host": "127.0.0.1", "certDir": str(cert_dir)},
        "leaderElection": {"leaderElect": False},
        "internalCertManagement": {"enable": False},
        "waitForPodsReady": {"timeout": pods_ready_timeout, "blockAdmission": False},
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


class KueueRunner:
    """Kueue's CRDs, installed once per session, and its manager, run with workload slices
    on or off: a test module asks for one (``kueue``, ``kueue_without_slices``), and the
    manager is restarted only when the gate must change."""

    # Short, so a job whose Workload never got PodsReady would be evicted within a test,
    # and long enough for a loaded machine: at 15 s, KWOK ran a job's two pods too late
    # and Kueue evicted it mid-test (00:47, load 20). bench/wave.py takes Kueue's default:
    # a wave's last pods run after minutes.
    def __init__(self, cluster: Cluster, home: Path, pods_ready_timeout: str = "60s") -> None:
        self.cluster, self.home = cluster, home
        self.binary = _build("binary")
        self.crds = _build("crds")
        self.running: Kueue | None = None
        cluster.kubectl("apply", "--server-side", "-f", self.crds)

        cluster.wait_established(
            *(
                f"{crd}.kueue.x-k8s.io"
                for crd in ("workloads", "clusterqueues", "localqueues", "resourceflavors")
            )
        )
        cluster.kubectl("create", "namespace", "kueue-system", check=False)
        _certificate(home / "certs")
        self.config = home / "config.yaml"
        self.config.write_text(yaml.safe_dump(configuration(home / "certs", pods_ready_timeout)))

    def ensure(self, slices: bool) -> Kueue:
        if self.running is not None and self.running.slices == slices:
            return self.running
        self.stop()
        self.running = self._start(slices)
        return self.running

    def _start(self, slices: bool) -> Kueue:
        # Outside pytest's temporary directories, which other sessions on the machine prune.
        log_path = Path(tempfile.mkdtemp(prefix="kueue-log-")) / "kueue.log"
        # Without its internal certificate management (which would wait for webhook
        # configurations this setup does not register) Kueue reads its metrics certificate
        # from a fixed path, /etc/kueue/metrics/certs: it gets one there in a mount namespace
        # of its own, over an overlay of /etc, so the machine's /etc is not touched.
        overlay = Path(tempfile.mkdtemp(prefix="etc-", dir=self.home))
        upper, work = overlay / "etc", overlay / "etc-work"
        upper.mkdir()
        work.mkdir()
        certs = self.home / "certs"
        script = (
            f"mount -t overlay overlay -o lowerdir=/etc,upperdir={upper},workdir={work} /etc"
            f" && mkdir -p /etc/kueue/metrics && cp -r {certs} /etc/kueue/metrics/certs"
            f' && exec "$0" "$@"'
        )
        with log_path.open("wb") as log:
            proc = subprocess.Popen(
                [
                    "unshare", "--mount", "--propagation", "private", "sh", "-c", script,
                    self.binary, f"--config={self.config}",
                    f"--feature-gates={feature_gates(slices)}",
                ],
                env={"KUBECONFIG": self.cluster.kubeconfig, "PATH": "/usr/bin:/bin"},
                stdout=log,
                stderr=subprocess.STDOUT,
            )  # fmt: skip
        running = Kueue(proc, log_path, slices)
        wait_for(
            lambda: "Starting workers" in running.logs() or proc.poll() is not None,
            timeout=120,
            what="Kueue's controllers to start",
        )
        assert proc.poll() is None, f"Kueue exited:\n{running.logs()[-5000:]}"
        return running

    def stop(self) -> None:
        if self.running is None:
            return
        stop_process(self.running.proc)
        print(f"--- Kueue log: {self.running.log_path} ---\n{self.running.logs()[-20000:]}")
        self.running = None


@pytest.fixture(scope="session")
def kueue_runner(
    cluster: Cluster, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[KueueRunner]:
    runner = KueueRunner(cluster, tmp_path_factory.mktemp("kueue"))
    try:
        yield runner
    finally:
        runner.stop()
        # Other tests of the session share the cluster: leave it without Kueue's API.
        cluster.kubectl("delete", "--wait=false", "-f", runner.crds, check=False)


@pytest.fixture(scope="module")
def kueue(kueue_runner: KueueRunner) -> Kueue:
    """Kueue with workload slices, its default since v0.18."""
    return kueue_runner.ensure(slices=True)


@pytest.fixture(scope="module")
def kueue_without_slices(kueue_runner: KueueRunner) -> Kueue:
    return kueue_runner.ensure(slices=False)

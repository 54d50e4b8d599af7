"""What a tenant can write with the rights it has, that once froze its job (issue 31):
helpers for the tests that play those writes."""

from __future__ import annotations

import json
from pathlib import Path

from mpijob_elastic.core import names
from tests.cluster import Cluster


def report_out_of_range(cluster: Cluster, namespace: str, job: str, tmp: Path) -> None:
    """With the launcher's own right, its patch on ``<job>-ranks``: a rank key whose start
    second lies in the year 10000, and one of 20 digits (OverflowError)."""
    kubeconfig = cluster.service_account_kubeconfig(
        namespace, names.launcher_name(job), tmp / "launcher.kubeconfig"
    )
    worker = names.worker_name(job, 0)
    report = {"data": {f"{worker}_1_253402300800": "start", f"{worker}_2_{'9' * 20}": "start"}}
    cluster.kubectl(
        "--kubeconfig", kubeconfig, "patch", "configmap", names.ranks_name(job),
        "-n", namespace, "--type=merge", "-p", json.dumps(report),
    )  # fmt: skip


def state_of_5000_digits(cluster: Cluster, namespace: str, job: str) -> None:
    """With the right of anyone who may edit ConfigMaps in the namespace: a state
    annotation of ``<job>-config`` past what int() reads."""
    cluster.kubectl(
        "annotate", "configmap", names.config_map_name(job), "-n", namespace,
        "--overwrite", f"{names.ANN_RETIRED_WORKERS}={'9' * 5000}",
    )  # fmt: skip

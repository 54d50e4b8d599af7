"""Benchmark: one worker added to a running job, ours beside training-operator 1.9.2's.

The same cases as ``bench.propagation`` (worker Running → its line in discover_hosts.sh,
one worker at a time, then bursts), on one cluster in one run: first with our controller
watching one namespace, then with training-operator's v1 controller (built from its Go
module by hack/build-training-operator.sh) watching another, each job alone in its
namespace. Training-operator runs out of the cluster here, so what its deployment would
provide is provided by hand: its webhook's certificate files (self-signed; the webhook is
never called: the webhook configuration it injects its CA into lists no webhook) and the
Secret it keeps them in.

    python -m bench.sidebyside [--rounds 20] [--bursts 50]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.cluster import (
    ROOT,
    Controller,
    cluster,
    free_port,
    install_crd,
    kubectl_binary,
    machine,
    sh,
)
from bench.propagation import bench, table

# Fixed by training-operator 1.9.2 (pkg/cert/cert.go, cmd/training-operator.v1/main.go).
CERT_DIR = Path("/tmp/k8s-webhook-server/serving-certs")
WEBHOOK_CONFIGURATION = "validator.training-operator.kubeflow.org"
WEBHOOK_SECRET = "training-operator-webhook-cert"


def training_operator_binary() -> str:
    return sh(str(ROOT / "hack/build-training-operator.sh")).strip().splitlines()[-1]


def start_training_operator(
    k: list[str], kubeconfig: str, namespace: str
) -> subprocess.Popen[bytes]:
    if not (CERT_DIR / "tls.crt").exists():
        CERT_DIR.mkdir(parents=True, exist_ok=True)
        sh(
            "openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
            "-subj", "/CN=training-operator", "-keyout", str(CERT_DIR / "tls.key"),
            "-out", str(CERT_DIR / "tls.crt"),
        )  # fmt: skip
    empty_webhooks = {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingWebhookConfiguration",
        "metadata": {"name": WEBHOOK_CONFIGURATION},
        "webhooks": [],
    }
    secret = {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": WEBHOOK_SECRET}}
    sh(*k, "apply", "-f", "-", input=json.dumps(empty_webhooks))
    sh(*k, "apply", "-n", namespace, "-f", "-", input=json.dumps(secret))
    env = dict(os.environ, KUBECONFIG=kubeconfig, MY_POD_NAMESPACE=namespace)
    log = Path(tempfile.gettempdir()) / f"training-operator-{namespace}.log"
    print(f"training-operator log: {log}", flush=True)
    with log.open("wb") as out:
        return subprocess.Popen(
            [
                training_operator_binary(),
                f"--namespace={namespace}",
                "--enable-scheme=mpijob",
                f"--metrics-bind-address=127.0.0.1:{free_port()}",
                f"--health-probe-bind-address=127.0.0.1:{free_port()}",
                f"--webhook-server-port={free_port()}",
            ],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )


def run(kubeconfig: str | None, rounds: int, bursts: list[int]) -> dict[str, Any]:
    result: dict[str, Any] = {"machine": machine()}
    with cluster(kubeconfig, pods=2 * max(bursts) + 100) as config:
        k = [kubectl_binary(), "--kubeconfig", config]
        install_crd(k)
        ours, theirs = f"bench-ours-{os.getpid()}", f"bench-to-{os.getpid()}"
        for namespace in (ours, theirs):
            sh(*k, "create", "namespace", namespace)
        controller = Controller(config, namespaces=ours)
        controller.start()
        try:
            result["ours"] = asyncio.run(bench(config, k, ours, rounds, bursts))
        finally:
            controller.stop()
        operator = start_training_operator(k, config, theirs)
        try:
            time.sleep(5)  # its caches and controllers start in the background
            result["training_operator"] = asyncio.run(bench(config, k, theirs, rounds, bursts))
        finally:
            operator.terminate()
            operator.wait(30)
        result["load_after"] = " ".join(f"{x:.1f}" for x in os.getloadavg())
    return result


def side_by_side(result: dict[str, Any]) -> str:
    lines = [
        "| case | ours p50 / p95 | training-operator 1.9.2 p50 / p95 |",
        "|---|---|---|",
    ]
    for a, b in zip(result["ours"], result["training_operator"], strict=True):
        lines.append(
            f"| {a['case']} | {a['median_ms']} / {a['p95_ms']} ms"
            f" | {b['median_ms']} / {b['p95_ms']} ms |"
        )
    m = result["machine"]
    lines += [
        "",
        f"Measured {m['date']}, {m['cpus']} CPUs; load average {m['load']} at the start,"
        f" {result['load_after']} at the end.",
    ]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--bursts", default="50", help="comma-separated burst sizes")
    parser.add_argument("--kubeconfig", default=os.environ.get("MPIJOB_ELASTIC_KUBECONFIG"))
    parser.add_argument("--out", type=Path, default=ROOT / "bench/out/sidebyside.md")
    args = parser.parse_args()
    result = run(args.kubeconfig, args.rounds, [int(b) for b in args.bursts.split(",")])
    text = side_by_side(result)
    print(table(result["ours"]), table(result["training_operator"]), text, sep="\n")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text)
    args.out.with_suffix(".json").write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()

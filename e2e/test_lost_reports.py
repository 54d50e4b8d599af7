"""End to end: the launcher's exit reports lost (core/inputs/ranks.py ``corrected``).

Each remote shell's exit is one ``kubectl patch`` of the ranks ConfigMap in the background
of the launcher, three tries. Under a loaded API server one can come late or never (CI on
kind: a victim's drain ran to its deadline 8 s after its rank left, the worker was retired
for a failure that never was, and every later step failed). Here an admission policy
refuses every exit report of one job, so each of its shells looks alive forever to the
reports. A scale-in's victims must still go soon after their ranks left, on a read of the
launcher's processes, far before their 60 s drain, without being retired; and a scale-out
that takes their names back right after must list them and run ranks there.

KWOK only (hack/e2e-kind.sh names the files it runs): the launcher is a local process, and
an exec read of it lists this machine's processes; the job's name is this test's own, so
no other test's shells are counted.
"""

from __future__ import annotations

import json
import time
from typing import Any

import pytest
import yaml

from e2e.harness import ElasticRun, report
from e2e.mockhorovod import events as ev
from mpijob_elastic.core import names
from mpijob_elastic.core.inputs.ranks import EXIT_SUFFIX
from tests.cluster import ROOT, Cluster
from tests.controller import ControllerProcess, wait_for
from tests.manifests import deny_in_namespace, wait_until_rejected

SAMPLE = ROOT / "config" / "samples" / "elastic-mpijob.yaml"
JOB = "lost-exit-reports"
WORKERS = 3
DRIVER_ARGS = ("-np", str(WORKERS), "--min-np", "1", "--max-np", "5")
# Long, so that a drain run to its deadline cannot pass for one ended by a read.
DRAIN_SECONDS = 60
# A victim must be gone this soon after its rank left: a read every 5 s, and the turn.
GONE_WITHIN_SECONDS = 20.0


def job_manifest() -> dict[str, Any]:
    job: dict[str, Any] = yaml.safe_load(SAMPLE.read_text())
    job["metadata"]["name"] = JOB
    job["metadata"]["annotations"][names.ANN_DRAIN_SECONDS] = str(DRAIN_SECONDS)
    job["metadata"]["annotations"]["mpijob-elastic.io/min-replicas"] = "1"
    job["spec"]["mpiReplicaSpecs"]["Worker"]["replicas"] = WORKERS
    return job


def refuse_exit_reports(cluster: Cluster, namespace: str) -> str:
    """An admission policy refusing any write that adds an exit report to the job's ranks
    ConfigMap in ``namespace``; its name, to delete it."""
    name = f"e2e-refuse-exit-reports-{namespace}"
    added_exit = (
        f"has(object.data) && object.data.exists(k, k.endsWith('{EXIT_SUFFIX}') && "
        "!(has(oldObject.data) && k in oldObject.data))"
    )
    policy = {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicy",
        "metadata": {"name": name},
        "spec": {
            "failurePolicy": "Fail",
            "matchConstraints": {
                "resourceRules": [
                    {
                        "apiGroups": [""],
                        "apiVersions": ["v1"],
                        "operations": ["UPDATE"],
                        "resources": ["configmaps"],
                        "resourceNames": [names.ranks_name(JOB)],
                    }
                ]
            },
            "validations": [
                {"expression": f"!({added_exit})", "message": "e2e: exit reports are lost"}
            ],
        },
    }
    binding = deny_in_namespace(name, namespace)
    cluster.kubectl(
        "apply",
        "-f",
        "-",
        input=json.dumps({"kind": "List", "apiVersion": "v1", "items": [policy, binding]}),
    )
    return name


def ranks_data(run: ElasticRun) -> dict[str, str]:
    out = run.kubectl("get", "configmap", names.ranks_name(JOB), "-o", "json")
    data: dict[str, str] = json.loads(out).get("data") or {}
    return data


def test_lost_exit_reports_neither_hold_a_drain_to_its_deadline_nor_keep_a_name_out(
    cluster: Cluster,
    e2e_namespace: str,
    controller: ControllerProcess,
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    run = ElasticRun(
        cluster,
        e2e_namespace,
        job_manifest(),
        tmp_path_factory.mktemp("lost-exit"),
        driver_args=DRIVER_ARGS,
    )
    policy = refuse_exit_reports(cluster, e2e_namespace)
    try:
        run.submit()
        run.start_launcher()
        run.wait_for_size(WORKERS, timeout=90)
        # The policy holds: an exit report is refused (a key no shell has, read as none).
        patch = json.dumps({"data": {f"e2e-check{EXIT_SUFFIX}": "0"}})
        wait_until_rejected(
            cluster,
            ["-n", e2e_namespace, "patch", "configmap", names.ranks_name(JOB), "-p", patch],
            "exit reports are lost",
            "the policy refusing exit reports",
        )
        victims = {names.worker_name(JOB, i) for i in (1, 2)}
        step = run.scale(1)
        gone = wait_for(
            lambda: time.time() if not victims & set(run.worker_pods()) else None,
            DRAIN_SECONDS,
            "the victims deleted",
        )
        left = {
            e["host"]: e["ts"]
            for e in run.driver_events(ev.RANK_STOPPED)
            if e["ts"] >= step.started and e["host"] in victims
        }
        assert set(left) == victims, left
        # Their ranks left, and the reports never said so: no exit report of theirs.
        data = ranks_data(run)
        exits = [k for k in data if k.endswith(EXIT_SUFFIX) and k.split("_")[0] in victims]
        assert exits == [], exits
        step.lines.append(
            f"victims gone {gone - max(left.values()):.2f}s after the last rank left "
            f"(drain {DRAIN_SECONDS}s)"
        )
        assert gone - max(left.values()) <= GONE_WITHIN_SECONDS
        config = json.loads(
            run.kubectl("get", "configmap", names.config_map_name(JOB), "-o", "json")
        )
        retired = (config["metadata"].get("annotations") or {}).get(names.ANN_RETIRED_WORKERS)
        assert not retired, retired
        # The names taken back at once: listed, and ranks run there.
        back = run.scale(WORKERS)
        run.wait_for_ranks_on({names.worker_name(JOB, i) for i in range(WORKERS)}, timeout=90)
        bad = [
            e
            for e in run.driver_events(*ev.FAILURE_EVENTS, *ev.FATAL_EVENTS)
            if e["ts"] >= step.started
        ]
        assert bad == [], bad
        back.lines.append("ranks on every name taken back")
    finally:
        run.close()
        cluster.kubectl(
            "delete",
            "validatingadmissionpolicybinding,validatingadmissionpolicy",
            policy,
            check=False,
        )
        report(run, "lost-exit-reports")

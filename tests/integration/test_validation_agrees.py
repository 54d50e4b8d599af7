"""The admission policy (CEL, config/admission, on a real API server) and the controller's
own validation (core/spec/parse.py and the bounds check) judge the same jobs alike.

Clusters may run without the policy, so the controller checks everything again; a job one
of them accepts and the other refuses would behave differently on two clusters. Each row
goes through both: the same verdict, the same field named, and, where the policy's message
is the controller's (``<field> <message>`` against ``<field>: <message>``), the same words.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

import pytest

from mpijob_elastic.core import names
from mpijob_elastic.core.spec.parse import InvalidSpec, parse
from tests.cluster import Cluster
from tests.manifests import mpijob

pytestmark = pytest.mark.usefixtures("crd")

WORKERS = "spec.mpiReplicaSpecs.Worker.replicas"
MIN = f"metadata.annotations[{names.ANN_MIN_REPLICAS}]"
MAX = f"metadata.annotations[{names.ANN_MAX_REPLICAS}]"


@dataclass(frozen=True)
class Verdict:
    accepted: bool
    # The fields named (the policy names one, the first rule that fails; the controller
    # every one), and the messages as "<field> <message>".
    fields: frozenset[str] = frozenset()
    messages: frozenset[str] = frozenset()


def annotated(key: str, value: str) -> dict[str, Any]:
    """An elastic job (a minimum, for below-min-timeout-seconds) with one annotation set."""
    job = mpijob("j", 2, min_replicas="1", max_replicas="4")
    job["metadata"]["annotations"][key] = value
    return job


def opportunistic(job: dict[str, Any]) -> dict[str, Any]:
    job["metadata"]["annotations"][names.ANN_OPPORTUNISTIC] = "true"
    return job


# (id, job, whether the policy's message must be one of the controller's word for word).
# Out-of-range Worker counts are only compared by field: the controller does not refuse
# the spec, it keeps the job's size with a ReplicasOutOfRange condition saying so.
ROWS: list[tuple[str, dict[str, Any], bool]] = [
    ("plain", mpijob("j", 2), False),
    ("defaults", mpijob("j", 2, launchers=None, slots=None), False),
    ("at-min", mpijob("j", 1, min_replicas="1", max_replicas="5"), False),
    ("at-max", mpijob("j", 5, min_replicas="1", max_replicas="5"), False),
    ("min-0", mpijob("j", 0, min_replicas="0", max_replicas="1"), False),
    ("fixed", mpijob("j", 3, min_replicas="3", max_replicas="3"), False),
    ("leading-zeros", mpijob("j", 7, min_replicas="007", max_replicas="0010"), False),
    ("no-bounds-0", mpijob("j", 0), False),
    ("no-bounds-1000", mpijob("j", 1000), False),
    ("above-max", mpijob("j", 6, min_replicas="1", max_replicas="5"), False),
    ("below-min", mpijob("j", 1, min_replicas="2", max_replicas="5"), False),
    ("below-min-no-max", mpijob("j", 0, min_replicas="1"), False),
    ("above-max-no-min", mpijob("j", 9, max_replicas="4"), False),
    ("unset-replicas-count-as-1", mpijob("j", None, min_replicas="2"), False),
    ("negative-workers", mpijob("j", -1), False),
    ("launcher-2", mpijob("j", 2, launchers=2), True),
    ("launcher-0", mpijob("j", 2, launchers=0), True),
    ("slots-0", mpijob("j", 2, slots=0), True),
    ("slots-negative", mpijob("j", 2, slots=-3), True),
    ("min-not-a-number", mpijob("j", 2, min_replicas="two"), True),
    ("max-negative", mpijob("j", 2, max_replicas="-1"), True),
    ("max-spaces", mpijob("j", 2, max_replicas=" 4 "), True),
    ("min-empty", mpijob("j", 2, min_replicas=""), True),
    ("max-0", mpijob("j", 0, max_replicas="0"), True),
    ("min-above-max", mpijob("j", 3, min_replicas="4", max_replicas="2"), True),
    # Durations (issue 24): 2**63 once passed both and made every reconcile raise.
    ("drain-2**63", annotated(names.ANN_DRAIN_SECONDS, "9223372036854775808"), True),
    ("drain-a-year", annotated(names.ANN_DRAIN_SECONDS, "31536000"), False),
    ("drain-a-year-and-a-bit", annotated(names.ANN_DRAIN_SECONDS, "31536000.5"), True),
    ("drain-padded", annotated(names.ANN_DRAIN_SECONDS, "0000000000031536000.0"), False),
    ("drain-400-digits", annotated(names.ANN_DRAIN_SECONDS, "9" * 400), False),
    ("drain-fraction", annotated(names.ANN_DRAIN_SECONDS, "2.50"), False),
    ("drain-words", annotated(names.ANN_DRAIN_SECONDS, "30s"), True),
    ("drain-empty", annotated(names.ANN_DRAIN_SECONDS, ""), True),
    ("drain-negative", annotated(names.ANN_DRAIN_SECONDS, "-1"), True),
    ("scale-out-2**63", annotated(names.ANN_SCALE_OUT_TIMEOUT, "9223372036854775808"), True),
    ("scale-out-nan", annotated(names.ANN_SCALE_OUT_TIMEOUT, "nan"), True),
    ("below-min-2**63", annotated(names.ANN_BELOW_MIN_TIMEOUT, "9223372036854775808"), True),
    ("below-min-1e3", annotated(names.ANN_BELOW_MIN_TIMEOUT, "1e3"), True),
    ("below-min-hour", annotated(names.ANN_BELOW_MIN_TIMEOUT, "3600"), False),
    ("checkpoint-0", annotated(names.ANN_CHECKPOINT_SECONDS, "0"), False),
    ("checkpoint-words", annotated(names.ANN_CHECKPOINT_SECONDS, "1m"), True),
    ("checkpoint-2**63", annotated(names.ANN_CHECKPOINT_SECONDS, "9223372036854775808"), True),
    # Elastic by capacity (issue 21).
    ("opportunistic", annotated(names.ANN_OPPORTUNISTIC, "true"), False),
    ("opportunistic-off", annotated(names.ANN_OPPORTUNISTIC, "false"), False),
    ("opportunistic-yes", annotated(names.ANN_OPPORTUNISTIC, "yes"), True),
    ("opportunistic-empty", annotated(names.ANN_OPPORTUNISTIC, ""), True),
    ("opportunistic-no-bounds", opportunistic(mpijob("j", 2)), True),
    ("opportunistic-no-max", opportunistic(mpijob("j", 2, min_replicas="1")), True),
    ("priority-class", annotated(names.ANN_OPPORTUNISTIC_PRIORITY_CLASS, "spot.low"), False),
    ("priority-class-upper", annotated(names.ANN_OPPORTUNISTIC_PRIORITY_CLASS, "Low"), True),
    ("priority-class-empty", annotated(names.ANN_OPPORTUNISTIC_PRIORITY_CLASS, ""), True),
]


def controller_verdict(job: dict[str, Any]) -> Verdict:
    try:
        spec = parse(job, 30)
    except InvalidSpec as err:
        return Verdict(
            False,
            frozenset(e.field for e in err.errors),
            frozenset(f"{e.field} {e.message}" for e in err.errors),
        )
    if not spec.bounds.contains(spec.worker.replicas):
        return Verdict(False, frozenset({WORKERS}))
    return Verdict(True)


# The API server's own refusal (the CRD's schema, the scale subresource's replicas path):
# "...is invalid: .spec.mpiReplicaSpecs.Worker.replicas: Invalid value: ...".
_BUILT_IN = re.compile(r"is invalid: \.?([^:\s]+): Invalid value")
_DENIED = "denied request: "


def cluster_verdict(cluster: Cluster, namespace: str, job: dict[str, Any]) -> Verdict:
    proc = cluster.kubectl(
        "create", "--dry-run=server", "-n", namespace, "-f", "-", input=json.dumps(job),
        check=False,
    )  # fmt: skip
    if proc.returncode == 0:
        return Verdict(True)
    if _DENIED in proc.stderr:
        message = proc.stderr.split(_DENIED, 1)[1].strip()
        return Verdict(False, frozenset({message.split(" ", 1)[0]}), frozenset({message}))
    built_in = _BUILT_IN.search(proc.stderr)
    assert built_in, f"refused for no field: {proc.stderr}"
    return Verdict(False, frozenset({built_in.group(1)}))


def test_the_policy_and_the_controller_agree(cluster: Cluster, admission_namespace: str) -> None:
    disagreements = []
    for row, job, same_words in ROWS:
        server = cluster_verdict(cluster, admission_namespace, job)
        ours = controller_verdict(job)
        if server.accepted != ours.accepted:
            disagreements.append(f"{row}: policy {server}, controller {ours}")
        elif not server.fields <= ours.fields:
            disagreements.append(f"{row}: policy names {server.fields}, controller {ours.fields}")
        elif same_words and not server.messages <= ours.messages:
            disagreements.append(
                f"{row}: policy says {server.messages}, controller {ours.messages}"
            )
    assert not disagreements, "\n".join(disagreements)
    # The table holds both answers, so neither side agrees by always saying the same.
    assert {controller_verdict(job).accepted for _, job, _ in ROWS} == {True, False}

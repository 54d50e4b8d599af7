"""The start-up checks' pure parts: what is asked, what the answers mean."""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from mpijob_elastic.app import preflight
from mpijob_elastic.app.flags import own_service_account
from mpijob_elastic.app.preflight import (
    METRICS_AUTH,
    REQUIRED,
    SCHEDULER_EVENTS,
    Permission,
    checks,
    crd_problem,
    pod_group_permissions,
    review,
)
from tests.cluster import ROOT

RBAC = ROOT / "config" / "rbac"


def shipped() -> set[tuple[str, str, str, str]]:
    """(verb, group, resource, subresource) of every rule in the shipped ClusterRoles."""
    found = set()
    for path in (RBAC / "role.yaml", RBAC / "nodes.yaml"):
        for doc in yaml.safe_load_all(path.read_text()):
            if doc["kind"] != "ClusterRole":
                continue
            for rule in doc["rules"]:
                for group in rule["apiGroups"]:
                    for resource in rule["resources"]:
                        base, _, sub = resource.partition("/")
                        found |= {(v, group, base, sub) for v in rule["verbs"]}
    return found


def test_the_check_asks_for_exactly_what_the_shipped_roles_grant() -> None:
    # A verb granted but not checked, or checked but not granted, is a mistake either way.
    # The PodGroups of the gang schedulers are checked only under one (the next test);
    # reading Events is asked for by the cache it serves (app/preemptions.py).
    gangs = [
        *pod_group_permissions("scheduling.volcano.sh"),
        *pod_group_permissions("scheduling.x-k8s.io"),
        *pod_group_permissions("scheduling.run.ai"),
    ]
    asked = {
        (p.verb, p.group, p.resource, p.subresource) for p in (*REQUIRED, *gangs, *SCHEDULER_EVENTS)
    }
    assert asked == shipped()


def test_cluster_scoped_permissions_are_asked_once_and_the_rest_per_namespace() -> None:
    asked = checks(["a", "b"])
    nodes = [(p, ns) for p, ns in asked if p.resource == "nodes"]
    assert nodes == [
        (Permission("list", "nodes", cluster_scoped=True), ""),
        (Permission("watch", "nodes", cluster_scoped=True), ""),
    ]
    pods = [ns for p, ns in asked if p == Permission("create", "pods")]
    assert pods == ["a", "b"]
    assert {ns for _, ns in checks([])} == {""}


def test_with_leader_election_the_lease_grants_are_asked_in_its_namespace_only() -> None:
    asked = [(p, ns) for p, ns in checks(["a"], ("system", "lease")) if p.resource == "leases"]
    assert [(p.verb, p.name, ns) for p, ns in asked] == [
        ("create", "", "system"),
        ("get", "lease", "system"),
        ("update", "lease", "system"),
    ]
    assert review(*asked[1])["spec"]["resourceAttributes"]["name"] == "lease"
    assert "get leases.coordination.k8s.io lease in namespace system" in [
        p.describe(ns) for p, ns in asked
    ]
    assert not [p for p, _ in checks(["a"]) if p.resource == "leases"]


def test_serving_metrics_asks_for_the_reviews_the_shipped_role_grants_once() -> None:
    rules = [
        (verb, group, resource)
        for doc in yaml.safe_load_all((RBAC / "metrics_auth.yaml").read_text())
        if doc["kind"] == "ClusterRole"
        for rule in doc["rules"]
        for group in rule["apiGroups"]
        for resource in rule["resources"]
        for verb in rule["verbs"]
    ]
    assert sorted((p.verb, p.group, p.resource) for p in METRICS_AUTH) == sorted(rules)
    asked = [(p, ns) for p, ns in checks(["a", "b"], metrics=True) if p in METRICS_AUTH]
    assert asked == [(p, "") for p in METRICS_AUTH]
    assert "create tokenreviews.authentication.k8s.io" in [p.describe(ns) for p, ns in asked]
    assert review(*asked[0])["spec"]["resourceAttributes"] == {
        "verb": "create",
        "group": "authentication.k8s.io",
        "resource": "tokenreviews",
        "subresource": "",
    }
    # Without /metrics, nothing asks who scrapes.
    assert not [p for p, _ in checks(["a"]) if p in METRICS_AUTH]


def test_a_review_names_the_subresource_and_the_namespace() -> None:
    body = review(Permission("get", "pods", "", "exec"), "team-a")
    assert body["kind"] == "SelfSubjectAccessReview"
    assert body["spec"]["resourceAttributes"] == {
        "verb": "get",
        "group": "",
        "resource": "pods",
        "subresource": "exec",
        "namespace": "team-a",
    }
    # All namespaces: no namespace attribute at all.
    everywhere = review(Permission("list", "mpijobs", "kubeflow.org"), "")
    assert "namespace" not in everywhere["spec"]["resourceAttributes"]


def test_descriptions_read_as_kubectl_auth_can_i_would() -> None:
    assert Permission("patch", "mpijobs", "kubeflow.org", "status").describe("") == (
        "patch mpijobs/status.kubeflow.org in all namespaces"
    )
    assert Permission("create", "pods").describe("team-a") == "create pods in namespace team-a"
    assert Permission("list", "nodes", cluster_scoped=True).describe("x") == "list nodes"


def group(*versions: str) -> dict[str, Any]:
    return {"kind": "APIGroup", "versions": [{"version": v} for v in versions]}


def test_the_v1_crd_passes() -> None:
    assert crd_problem(group("v1"), ["mpijobs", "mpijobs/status"]) is None


def test_mpi_operator_v2s_crd_is_named_with_what_to_do() -> None:
    problem = crd_problem(group("v2beta1"), [])
    assert problem is not None
    assert "serves v2beta1: that is MPI Operator v2's CRD" in problem
    # Serving v1 beside v2beta1 is still MPI Operator v2's CRD, converting.
    assert crd_problem(group("v2beta1", "v1"), ["mpijobs"]) == problem


@pytest.mark.parametrize(
    ("served", "resources", "says"),
    [
        (None, [], "the kubeflow.org API is not served"),
        (
            group("v1"),
            ["tfjobs", "pytorchjobs"],
            "not served at kubeflow.org/v1 (versions served: v1)",
        ),
        (group("v1alpha2"), [], "versions served: v1alpha2"),
    ],
)
def test_a_missing_v1_crd_is_named(
    served: dict[str, Any] | None, resources: list[str], says: str
) -> None:
    problem = crd_problem(served, resources)
    assert problem is not None
    assert says in problem


def test_the_missing_permissions_message_says_where_to_look() -> None:
    message = preflight.missing_message(["get pods in all namespaces"])
    assert message.startswith("missing 1 permission(s): get pods in all namespaces.")
    assert "docs/rbac.md" in message


def test_the_controllers_identity_comes_from_both_variables() -> None:
    env = {"POD_NAMESPACE": "sys", "POD_SERVICE_ACCOUNT": "me"}
    assert own_service_account(env) == ("sys", "me")
    assert own_service_account({"POD_NAMESPACE": "sys"}) is None
    assert own_service_account({}) is None


def test_a_gang_scheduler_s_pod_groups_are_checked_only_under_one() -> None:
    asked = [
        (p, ns)
        for p, ns in checks(["a"], pod_groups="scheduling.x-k8s.io")
        if p.resource == "podgroups"
    ]
    assert sorted((p.group, p.verb, ns) for p, ns in asked) == [
        ("scheduling.x-k8s.io", v, "a")
        for v in sorted(["list", "watch", "create", "update", "delete"])
    ]
    assert not [p for p, _ in checks(["a"]) if p.resource == "podgroups"]

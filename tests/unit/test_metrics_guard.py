"""The metrics guard's pure parts: the token read from the header, the reviews asked, what
their answers decide, and how long a decision is remembered. Against the API server:
tests/integration/test_metrics_guard.py."""

from __future__ import annotations

import pytest
import yaml

from mpijob_elastic.app.metrics_guard import (
    ACCESS_REVIEWS,
    DECISION_TTL_SECONDS,
    TOKEN_REVIEWS,
    Decision,
    Decisions,
    access_review,
    authenticated,
    authorized,
    bearer_token,
    digest,
    refusal,
    token_review,
)
from mpijob_elastic.machinery.kube import is_review
from tests.controller import METRICS_READER


@pytest.mark.parametrize(
    ("header", "token"),
    [
        ("Bearer abc.def", "abc.def"),
        ("bearer abc", "abc"),
        ("  Bearer   abc  ", "abc"),
        (None, None),
        ("", None),
        ("Bearer", None),
        ("Bearer ", None),
        ("Basic dXNlcjpwYXNz", None),
    ],
)
def test_only_a_bearer_token_is_read(header: str | None, token: str | None) -> None:
    assert bearer_token(header) == token


def test_the_reviews_ask_about_the_user_the_token_is_and_get_on_metrics() -> None:
    assert token_review("t") == {
        "apiVersion": "authentication.k8s.io/v1",
        "kind": "TokenReview",
        "spec": {"token": "t"},
    }
    user = {
        "username": "system:serviceaccount:monitoring:prometheus",
        "uid": "u-1",
        "groups": ["system:serviceaccounts", "system:authenticated"],
        "extra": {"authentication.kubernetes.io/pod-name": ["prometheus-0"]},
    }
    review = access_review(user)
    assert review["kind"] == "SubjectAccessReview"
    assert review["spec"] == {
        "user": "system:serviceaccount:monitoring:prometheus",
        "uid": "u-1",
        "groups": ["system:serviceaccounts", "system:authenticated"],
        "extra": {"authentication.kubernetes.io/pod-name": ["prometheus-0"]},
        "nonResourceAttributes": {"path": "/metrics", "verb": "get"},
    }
    # The verb and path the shipped reader role grants.
    (rule,) = yaml.safe_load(METRICS_READER.read_text())["rules"]
    attributes = review["spec"]["nonResourceAttributes"]
    assert (rule["nonResourceURLs"], rule["verbs"]) == ([attributes["path"]], [attributes["verb"]])


def test_the_answers_decide_401_403_or_200() -> None:
    assert authenticated({"authenticated": True, "user": {"username": "u"}}) is None
    refused = authenticated({"authenticated": False, "error": "invalid bearer token"})
    assert refused == Decision(401, "", "invalid bearer token")
    assert authenticated({})
    assert authorized("u", {"allowed": True}) == Decision(200, "u", "")
    denied = authorized("u", {"allowed": False})
    assert (denied.status, denied.user) == (403, "u")
    assert "get on /metrics" in denied.reason
    assert refusal(refused).status == 401
    assert refusal(refused).headers["WWW-Authenticate"] == "Bearer"
    forbidden = refusal(denied)
    assert forbidden.status == 403
    assert forbidden.text == "Forbidden: u may not get /metrics\n"


def test_a_decision_is_remembered_for_the_ttl_only() -> None:
    decisions = Decisions()
    allowed = Decision(200, "u", "")
    decisions.put("k", allowed, now=100.0)
    # A scrape every 15 to 30 s: the next one or two find it.
    assert decisions.get("k", 100.0 + 30) == allowed
    assert decisions.get("k", 100.0 + DECISION_TTL_SECONDS - 0.1) == allowed
    assert decisions.get("k", 100.0 + DECISION_TTL_SECONDS) is None
    assert decisions.get("other", 100.0) is None


def test_the_memory_is_bounded_and_drops_the_oldest_and_the_expired() -> None:
    decisions = Decisions(ttl=10, size=3)
    for n in range(3):
        decisions.put(f"k{n}", Decision(401, "", ""), now=float(n))
    decisions.put("k3", Decision(401, "", ""), now=3.0)
    assert decisions.get("k0", 3.0) is None  # the oldest made room
    assert all(decisions.get(f"k{n}", 3.0) for n in (1, 2, 3))
    # Expired ones go first, whatever the bound.
    decisions.put("k4", Decision(200, "u", ""), now=12.5)
    assert decisions.get("k3", 12.5) is not None
    assert decisions.get("k4", 12.5) is not None
    assert [decisions.get(f"k{n}", 12.5) for n in (1, 2)] == [None, None]


def test_tokens_are_kept_as_digests() -> None:
    assert digest("secret") != "secret"
    assert len(digest("secret")) == 64
    assert digest("secret") == digest("secret") != digest("secret2")


@pytest.mark.parametrize(
    ("path", "review"),
    [
        (TOKEN_REVIEWS, True),
        (ACCESS_REVIEWS, True),
        ("/apis/authorization.k8s.io/v1/selfsubjectaccessreviews?fieldManager=x", True),
        ("/api/v1/namespaces/a/pods", False),
        ("/apis/coordination.k8s.io/v1/namespaces/a/leases/tokenreviews-not", False),
    ],
)
def test_reviews_are_logged_as_checks_not_writes(path: str, review: bool) -> None:
    assert is_review(path) is review

"""/metrics behind the API server's authentication, against the real API server: no
token or a bad one 401, a ServiceAccount without the reader role 403, with it 200; the
probes on the same port need no token; and a scrape within the decision's TTL makes no
new review (read from the controller's debug log, where every review is an ``api check``
line: kube.py)."""

from __future__ import annotations

import contextlib
import http.client
import os
import signal
import threading
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from mpijob_elastic.app import metrics_guard
from tests.cluster import Cluster
from tests.controller import (
    ControllerProcess,
    StartController,
    free_port,
    scraper_tls,
    wait_for,
)

pytestmark = pytest.mark.usefixtures("crd")


def get(port: int, path: str, token: str | None = None) -> tuple[int, str, str]:
    """(status, body, WWW-Authenticate) of a GET, as a scraper sees it."""
    headers = {"Authorization": f"Bearer {token}"} if token is not None else {}
    request = urllib.request.Request(f"https://127.0.0.1:{port}{path}", headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=10, context=scraper_tls()) as answer:
            return answer.status, answer.read().decode(), ""
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode(), err.headers.get("WWW-Authenticate", "")


def reviews(controller: ControllerProcess, resource: str) -> int:
    return sum(
        1
        for e in controller.log_entries()
        if e.get("msg") == "api check" and e["path"].split("?")[0].endswith(f"/{resource}")
    )


def test_only_a_token_allowed_to_get_metrics_reads_them(
    cluster: Cluster, namespace: str, start_controller: StartController, metrics_token: str
) -> None:
    port = free_port()
    # One port for the probes and the metrics: the probes stay open, /metrics does not.
    controller = start_controller(
        namespace,
        args=("--health-port", str(port), "--metrics-port", str(port), "--log-level", "debug"),
    )
    assert get(port, "/healthz") == (200, "ok\n", "")
    wait_for(lambda: get(port, "/readyz")[0] == 200, 30, "/readyz without a token")

    status, body, challenge = get(port, "/metrics")
    assert (status, challenge) == (401, "Bearer"), body
    assert reviews(controller, "tokenreviews") == 0  # no token, nothing to ask
    assert get(port, "/metrics", "not-a-token")[0] == 401
    assert reviews(controller, "tokenreviews") == 1
    assert reviews(controller, "subjectaccessreviews") == 0  # no user to ask about

    # A valid ServiceAccount token, of a ServiceAccount not bound to the reader role.
    cluster.kubectl("create", "serviceaccount", "stranger", "-n", namespace)
    stranger = cluster.kubectl("create", "token", "stranger", "-n", namespace).stdout.strip()
    status, body, _ = get(port, "/metrics", stranger)
    assert status == 403, body
    assert f"system:serviceaccount:{namespace}:stranger may not get /metrics" in body
    refused = [e for e in controller.log_entries() if e.get("msg") == "metrics scrape refused"]
    assert {(e["code"], e["user"]) for e in refused} >= {
        (403, f"system:serviceaccount:{namespace}:stranger")
    }

    status, body, _ = get(port, "/metrics", metrics_token)
    assert status == 200, body
    assert "# TYPE mpijob_elastic_reconciles_total counter" in body
    token_reviews = reviews(controller, "tokenreviews")
    access_reviews = reviews(controller, "subjectaccessreviews")
    assert (token_reviews, access_reviews) == (3, 2)

    # Within the TTL (60 s), the same tokens are answered from memory: allowed and refused.
    assert get(port, "/metrics", metrics_token)[0] == 200
    assert get(port, "/metrics", stranger)[0] == 403
    assert get(port, "/metrics", "not-a-token")[0] == 401
    assert reviews(controller, "tokenreviews") == token_reviews
    assert reviews(controller, "subjectaccessreviews") == access_reviews
    # Reviews store nothing: none of them is a write.
    assert not [
        e for e in controller.log_entries() if e.get("msg") == "api write" and "review" in e["path"]
    ]


def apiserver_pid(cluster: Cluster) -> int:
    """This test cluster's kube-apiserver process (KWOK runs it here, with its files under
    the kubeconfig's directory); others' clusters may run beside it."""
    home = f"{Path(cluster.kubeconfig).parent}/"
    for proc in Path("/proc").glob("[0-9]*"):
        with contextlib.suppress(OSError):
            argv = (proc / "cmdline").read_bytes().decode(errors="replace").split("\0")
            if argv and argv[0].endswith("kube-apiserver") and any(home in a for a in argv):
                return int(proc.name)
    pytest.fail(f"no kube-apiserver of {home}: not a local KWOK cluster")


def test_a_silent_api_server_holds_no_scrape_past_the_review_timeout(
    cluster: Cluster, namespace: str, start_controller: StartController, metrics_token: str
) -> None:
    """Issue 31 §4: anyone who reaches the port may send made-up tokens, each a review.
    With the API server stopped, a scrape waits at most REVIEW_TIMEOUT_SECONDS (500), at
    most WAITING_AT_MOST wait at once (503 for the others, at once), and a scraper whose
    token was reviewed already is still served."""
    port = free_port()
    start_controller(namespace, args=("--metrics-port", str(port)))
    wait_for(lambda: get(port, "/metrics", metrics_token)[0] == 200, 30, "a first scrape")
    pid = apiserver_pid(cluster)
    os.kill(pid, signal.SIGSTOP)
    try:
        # Every connection's TLS handshake first, then all 40 requests at once: on a loaded
        # machine 40 handshakes in a row outlast the review timeout, and scrapes that came
        # one by one would each find a free place to wait.
        released: list[float] = []
        ready = threading.Barrier(40, action=lambda: released.append(time.monotonic()))

        def scrape(i: int) -> int:
            connection = http.client.HTTPSConnection(
                "127.0.0.1", port, timeout=30, context=scraper_tls()
            )
            try:
                connection.connect()
                ready.wait(30)
                connection.request(
                    "GET", "/metrics", headers={"Authorization": f"Bearer made-up-{i}"}
                )
                return connection.getresponse().status
            finally:
                connection.close()

        with ThreadPoolExecutor(40) as pool:
            codes = list(pool.map(scrape, range(40)))
        took = time.monotonic() - released[0]
        assert get(port, "/metrics", metrics_token)[0] == 200
    finally:
        os.kill(pid, signal.SIGCONT)
    assert set(codes) == {500, 503}, codes
    assert codes.count(500) <= metrics_guard.WAITING_AT_MOST, codes
    assert took < metrics_guard.REVIEW_TIMEOUT_SECONDS + 4, took
    # The API server back, a new token is reviewed again (a failure is not remembered).
    assert get(port, "/metrics", "made-up-0")[0] == 401

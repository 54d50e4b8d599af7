"""The probes' endpoints on a real controller process."""

from __future__ import annotations

import urllib.error
import urllib.request

import pytest

from tests.controller import StartController, free_port, wait_for

# Without the CRD the job informer never syncs: run alone, this file needs it installed.
pytestmark = pytest.mark.usefixtures("crd")


def get(port: int, path: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as answer:
            return answer.status, answer.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode()


def test_a_synced_controller_is_live_and_ready(
    namespace: str, start_controller: StartController
) -> None:
    port = free_port()
    controller = start_controller(namespace, args=("--health-port", str(port)))
    assert get(port, "/healthz") == (200, "ok\n")
    # Ready once the reconcile workers run, which follows the caches' sync at once.
    wait_for(lambda: get(port, "/readyz") == (200, "ok\n"), 30, "/readyz to answer ok")
    controller.stop()
    try:
        get(port, "/healthz")
    except urllib.error.URLError:
        pass
    else:
        raise AssertionError("the health server outlived the controller")

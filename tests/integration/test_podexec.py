"""PodExec against the real API server: bytes, refusals, the deadline, and the RBAC verb.

On the local KWOK cluster an exec into any fake pod runs the command on this machine
(hack/kwok/exec.yaml), after the real kube-apiserver has authenticated and authorized it,
so output and refusals here are the API server's own.
"""

from __future__ import annotations

import asyncio
import copy
import json
import os
import time
from collections.abc import AsyncIterator
from functools import partial
from pathlib import Path
from typing import Any

import pytest

from mpijob_elastic.machinery.clients import load_configuration
from mpijob_elastic.machinery.kube import ApiError
from mpijob_elastic.machinery.podexec import ExecConnectionError, PodExec
from tests.cluster import Cluster
from tests.controller import free_port, wait_for
from tests.manifests import CONFIG, load_documents

pytestmark = pytest.mark.cluster

POD = "target"
CONTAINER = "main"


def pod(name: str, **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "containers": [{"name": CONTAINER, "image": "busybox", "command": ["sleep", "1d"]}],
            **spec,
        },
    }


def running_pod(cluster: Cluster, namespace: str, name: str = POD) -> None:
    cluster.apply(pod(name), namespace)
    cluster.kubectl(
        "wait", "-n", namespace, f"pod/{name}", "--for=jsonpath={.status.phase}=Running",
        "--timeout=30s",
    )  # fmt: skip


@pytest.fixture
async def target(cluster: Cluster, namespace: str) -> str:
    running_pod(cluster, namespace)
    return namespace


@pytest.fixture
async def admin(cluster: Cluster) -> AsyncIterator[PodExec]:
    async with PodExec(await load_configuration(cluster.kubeconfig)) as pod_exec:
        yield pod_exec


async def test_stdout_comes_back_byte_for_byte(admin: PodExec, target: str, tmp_path: Path) -> None:
    result = await admin.run(target, POD, CONTAINER, ["printf", r"a\0b\0"], timeout=10)
    assert result.stdout == b"a\x00b\x00"
    assert result.exit_code == 0
    assert result.succeeded

    # Every byte value, several hundred KB: many websocket frames, nothing decoded.
    blob = os.urandom(300_000) + bytes(range(256))
    (tmp_path / "blob").write_bytes(blob)
    result = await admin.run(target, POD, None, ["cat", str(tmp_path / "blob")], timeout=10)
    assert len(result.stdout) == len(blob)
    assert result.stdout == blob

    # stderr is not requested, so it cannot leak into stdout.
    script = "printf out; printf err >&2; printf ' more'"
    result = await admin.run(target, POD, CONTAINER, ["sh", "-c", script], timeout=10)
    assert result.stdout == b"out more"


async def test_a_failing_command_still_returns_its_stdout(admin: PodExec, target: str) -> None:
    """As ``cat /proc/[0-9]*/cmdline`` does when a process exits between glob and read."""
    result = await admin.run(
        target, POD, CONTAINER, ["sh", "-c", r"printf 'x\0'; exit 3"], timeout=10
    )
    assert result.stdout == b"x\x00"
    assert not result.succeeded
    # A kubelet reports NonZeroExitCode with the code; KWOK reports a bare internal error,
    # so the code is unknown and the server's message says what happened.
    assert result.exit_code is None
    assert result.failure is not None
    assert "exit status 3" in result.failure


async def test_refusals_are_api_errors_with_the_servers_message(
    cluster: Cluster, admin: PodExec, target: str
) -> None:
    with pytest.raises(ApiError) as missing:
        await admin.run(target, "no-such-pod", None, ["true"], timeout=10)
    assert missing.value.status == 404
    assert missing.value.not_found
    assert missing.value.message == 'pods "no-such-pod" not found'

    with pytest.raises(ApiError) as container:
        await admin.run(target, POD, "no-such-container", ["true"], timeout=10)
    assert container.value.status == 400
    assert "no-such-container is not valid" in container.value.message

    # Never scheduled: no node to exec on.
    cluster.apply(pod("pending", nodeSelector={"no-such-label": "x"}), target)
    with pytest.raises(ApiError) as pending:
        await admin.run(target, "pending", None, ["true"], timeout=10)
    assert pending.value.status == 400
    assert "does not have a host assigned" in pending.value.message


async def test_concurrent_calls_keep_their_own_answers(admin: PodExec, target: str) -> None:
    """Each call's output and refusal message are its own, across tasks on one PodExec."""

    async def one(i: int) -> bytes | ApiError:
        name = POD if i % 2 else f"missing-{i}"
        try:
            result = await admin.run(target, name, None, ["sh", "-c", f"printf {i}"], 10)
        except ApiError as err:
            return err
        return result.stdout

    answers = await asyncio.gather(*(one(i) for i in range(20)))
    for i, answer in enumerate(answers):
        if i % 2:
            assert answer == str(i).encode()
        else:
            assert isinstance(answer, ApiError)
            assert answer.message == f'pods "missing-{i}" not found'


async def test_output_past_the_cap_is_not_read(admin: PodExec, target: str) -> None:
    """The command runs in the user's image and may print without end (issue 31): the
    call stops reading at MAX_OUTPUT, long before its timeout. (20 MB, so that the
    command ends by itself: KWOK runs it on this machine.)"""
    started = time.monotonic()
    with pytest.raises(ExecConnectionError, match="more than 4194304 bytes"):
        await admin.run(target, POD, None, ["head", "-c", "20000000", "/dev/zero"], timeout=60)
    assert time.monotonic() - started < 30
    # Below the cap, all of it.
    result = await admin.run(target, POD, None, ["head", "-c", "4000000", "/dev/zero"], timeout=60)
    assert len(result.stdout) == 4_000_000


async def test_the_timeout_bounds_a_command_that_does_not_end(admin: PodExec, target: str) -> None:
    started = time.monotonic()
    with pytest.raises(TimeoutError):
        await admin.run(target, POD, None, ["sleep", "30"], timeout=1.5)
    took = time.monotonic() - started
    assert 1.5 <= took < 2.5, took
    # The client is still good for the next call.
    assert (await admin.run(target, POD, None, ["echo", "ok"], timeout=10)).stdout == b"ok\n"


async def test_no_api_server_is_a_connection_error(cluster: Cluster) -> None:
    configuration = copy.deepcopy(await load_configuration(cluster.kubeconfig))
    configuration.host = f"https://127.0.0.1:{free_port()}"
    async with PodExec(configuration) as pod_exec:
        with pytest.raises(ExecConnectionError):
            await pod_exec.run("default", POD, None, ["true"], timeout=10)


# -- Which RBAC verb a websocket exec needs ------------------------------------------------


def can(cluster: Cluster, namespace: str, account: str, verb: str) -> bool:
    review = {
        "apiVersion": "authorization.k8s.io/v1",
        "kind": "SubjectAccessReview",
        "spec": {
            "user": f"system:serviceaccount:{namespace}:{account}",
            "groups": ["system:serviceaccounts", f"system:serviceaccounts:{namespace}"],
            "resourceAttributes": {
                "namespace": namespace,
                "verb": verb,
                "resource": "pods",
                "subresource": "exec",
                "name": POD,
            },
        },
    }
    out = cluster.kubectl("create", "-o", "json", "-f", "-", input=json.dumps(review))
    return bool(json.loads(out.stdout)["status"].get("allowed"))


async def exec_as(
    cluster: Cluster, namespace: str, account: str, verbs: list[str], tmp_path: Path
) -> bytes | ApiError:
    """Exec ``echo ok`` as a fresh ServiceAccount whose only pods/exec verbs are ``verbs``."""
    cluster.kubectl("create", "serviceaccount", account, "-n", namespace)
    if verbs:
        role = {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "Role",
            "metadata": {"name": account},
            "rules": [{"apiGroups": [""], "resources": ["pods/exec"], "verbs": verbs}],
        }
        cluster.apply(role, namespace)
        cluster.kubectl(
            "create", "rolebinding", account, "-n", namespace, f"--role={account}",
            f"--serviceaccount={namespace}:{account}",
        )  # fmt: skip
    # The authorizer's cache must hold the grant before a refusal means anything.
    for verb in verbs:
        wait_for(partial(can, cluster, namespace, account, verb), 30, f"RBAC to show {verb}")
    kubeconfig = cluster.service_account_kubeconfig(namespace, account, tmp_path / account)
    async with PodExec(await load_configuration(kubeconfig)) as pod_exec:
        try:
            result = await pod_exec.run(namespace, POD, None, ["echo", "ok"], timeout=10)
        except ApiError as err:
            return err
    return result.stdout


def shipped_exec_verbs() -> list[str]:
    role = load_documents(CONFIG / "rbac" / "role.yaml")[0]
    verbs = [r["verbs"] for r in role["rules"] if r["resources"] == ["pods/exec"]]
    assert len(verbs) == 1, verbs
    return list(verbs[0])


async def test_without_pods_exec_the_server_refuses_with_403(
    cluster: Cluster, target: str, tmp_path: Path
) -> None:
    answer = await exec_as(cluster, target, "no-exec", [], tmp_path)
    assert isinstance(answer, ApiError), answer
    assert answer.status == 403
    assert 'cannot get resource "pods/exec"' in answer.message


async def test_a_websocket_exec_is_authorized_as_get(
    cluster: Cluster, target: str, tmp_path: Path
) -> None:
    """The finding behind `get` in the ClusterRole (docs/rbac.md).

    A websocket upgrade is a GET, and Kubernetes 1.34 authorizes it as verb `get` only:
    `create` alone, all the ClusterRole once held, is refused. (A POST upgrade would be
    authorized as `create`, but the API server answers it 405.) From 1.35 the
    AuthorizePodWebsocketUpgradeCreatePermission gate also checks `create` on websocket
    upgrades; if this test starts failing on `get` alone, that is why, and the ClusterRole,
    holding both, is still right.
    """
    create_only = await exec_as(cluster, target, "exec-create", ["create"], tmp_path)
    assert isinstance(create_only, ApiError), create_only
    assert create_only.status == 403
    assert 'cannot get resource "pods/exec"' in create_only.message

    get_only = await exec_as(cluster, target, "exec-get", ["get"], tmp_path)
    assert get_only == b"ok\n"

    shipped = await exec_as(cluster, target, "exec-shipped", shipped_exec_verbs(), tmp_path)
    assert shipped == b"ok\n"

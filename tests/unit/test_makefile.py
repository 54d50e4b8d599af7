"""What the Makefile's targets build (issue 29): `make demo` and `make cluster-up` build
only the Kubernetes binaries the local cluster runs; `make test` builds everything the
tests use. Read from `make -n`, which prints the commands without running them."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
EVERY_BUILD = {
    "build-binaries.sh",
    "build-scheduler-plugins.sh",
    "build-promtool.sh promtool",
    "build-promtool.sh prometheus",
    "build-helm.sh",
    "build-kueue.sh",
}


def builds(target: str) -> set[str]:
    out = subprocess.run(
        ["make", "-n", "-C", str(ROOT), target],
        check=True,
        stdout=subprocess.PIPE,
        text=True,
    ).stdout
    return set(re.findall(r"hack/(build-[\w-]+\.sh(?: promtool| prometheus)?)", out))


@pytest.mark.parametrize("target", ["demo", "cluster-up"])
def test_the_demo_and_the_local_cluster_build_only_the_kubernetes_binaries(target: str) -> None:
    assert builds(target) == {"build-binaries.sh"}


def test_make_test_builds_everything_the_tests_use() -> None:
    """The Kubernetes binaries before the suite; the test tools in the background while it
    runs (hack/test.sh)."""
    assert builds("test") == {"build-binaries.sh"}
    assert builds("kube-binaries") | builds("test-tools") == EVERY_BUILD
    assert "make -s test-tools" in (ROOT / "hack" / "test.sh").read_text()
    assert builds("binaries") == EVERY_BUILD

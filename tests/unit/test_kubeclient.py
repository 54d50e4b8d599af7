"""kubeclient: the controller loads kubernetes_asyncio without its generated models."""

from __future__ import annotations

import subprocess
import sys

LOADED = (
    "import sys, mpijob_elastic.cli\n"
    "print('\\n'.join(m for m in sys.modules if m.startswith('kubernetes_asyncio')))\n"
)


def test_the_controller_imports_no_model_and_no_api_class() -> None:
    # A fresh interpreter: this test process may have imported the package whole.
    out = subprocess.run(
        [sys.executable, "-c", LOADED], check=True, capture_output=True, text=True
    ).stdout.split()
    assert "kubernetes_asyncio.config.kube_config" in out
    assert "kubernetes_asyncio.client.api_client" in out
    heavy = [
        m
        for m in out
        if m.startswith(("kubernetes_asyncio.client.models.", "kubernetes_asyncio.client.api."))
    ]
    assert heavy == []

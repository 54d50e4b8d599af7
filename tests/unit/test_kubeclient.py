"""kubeclient: the controller loads kubernetes_asyncio without its generated models."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

LOADED = (
    "import sys, mpijob_elastic.app.cli\n"
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


LOADERS = """
import asyncio, os, sys
from mpijob_elastic.machinery import clients
from mpijob_elastic.machinery.kubeclient import Configuration, kube_config

d = sys.argv[1]
with open(f"{d}/kubeconfig", "w") as f:
    f.write('''
apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "https://10.0.0.1:6443", insecure-skip-tls-verify: true}}]
users: [{name: u, user: {token: from-kubeconfig}}]
contexts: [{name: x, context: {cluster: c, user: u}}]
current-context: x
''')
loaded = asyncio.run(clients.load_configuration(f"{d}/kubeconfig"))
print(loaded.host, loaded.api_key["BearerToken"])
for name, text in (("token", "from-serviceaccount"), ("ca.crt", "not read here")):
    with open(f"{d}/{name}", "w") as f:
        f.write(text)
os.environ.update(KUBERNETES_SERVICE_HOST="10.0.0.2", KUBERNETES_SERVICE_PORT="443")
pod = Configuration()
kube_config.load_incluster_config(
    client_configuration=pod, token_filename=f"{d}/token", cert_filename=f"{d}/ca.crt"
)
print(pod.host, pod.api_key["BearerToken"])
print(any(m.startswith("kubernetes_asyncio.client.models.") for m in sys.modules))
"""


def test_both_loaders_work_without_the_models(tmp_path: Path) -> None:
    out = subprocess.run(
        [sys.executable, "-c", LOADERS, str(tmp_path)], check=True, capture_output=True, text=True
    ).stdout.splitlines()
    assert out == [
        "https://10.0.0.1:6443 Bearer from-kubeconfig",
        "https://10.0.0.2:443 Bearer from-serviceaccount",
        "False",
    ]


CONNECT = """
import asyncio
from mpijob_elastic.machinery import clients
from mpijob_elastic.machinery.kubeclient import Configuration

async def main() -> None:
    for host in ("https://10.0.0.1:6443", "https://api.example:6443"):
        configuration = Configuration(host=host)
        made = clients.connect(configuration, write_connections=4)
        for client in (made.write, made.watch):
            rest = client.rest_client
            print(host, rest.proxy, rest.pool_manager.trust_env)
        await made.close()
        print(configuration.proxy)

asyncio.run(main())
"""


def test_the_environment_s_proxy_is_read_once_and_never_per_request() -> None:
    # aiohttp's trust_env reads the proxy variables and ~/.netrc on every request, in a
    # thread each: a tenth of the controller's CPU in a mass change.
    env = {"HTTPS_PROXY": "http://proxy.example:3128", "NO_PROXY": "10.0.0.1", "PATH": ""}
    out = subprocess.run(
        [sys.executable, "-c", CONNECT], check=True, capture_output=True, text=True, env=env
    ).stdout.splitlines()
    assert out == [
        "https://10.0.0.1:6443 None False",
        "https://10.0.0.1:6443 None False",
        "None",
        "https://api.example:6443 http://proxy.example:3128 False",
        "https://api.example:6443 http://proxy.example:3128 False",
        "None",  # the caller's configuration is left as it was
    ]

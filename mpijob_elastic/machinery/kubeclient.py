"""The parts of kubernetes_asyncio the controller uses, without the 700 generated models.

The controller takes from kubernetes_asyncio only the configuration loaders (kubeconfig
with its exec plugins and token refresh, or the pod's ServiceAccount), the
``Configuration`` they fill, ``ApiClient`` for its TLS connector, authentication and
``call_api`` (always with ``_preload_content=False``: responses are parsed here, as
dicts), and two constants and a URL helper of its websocket client. It never makes or
reads a model object.

Yet any import from the package runs ``kubernetes_asyncio/__init__.py``, which imports
``kubernetes_asyncio.client``, whose ``__init__`` imports every generated API class and
every model: 32 MB of RSS (78.8 MB against 46.7 MB for ``import mpijob_elastic.app.cli``),
more than all the caches of 1000 jobs. So the two package modules are put in place here
as plain packages, without running their ``__init__``; every submodule below them is the
library's own, imported as usual. ``api_client`` imports the models package only to look
up a model class by name when it deserializes a response, which ``call_api`` does only
for a ``response_type``, and the controller never passes one; an empty models package
stands in for it.

If something imported kubernetes_asyncio whole before this module (a test, a benchmark),
that import is used as it is: the names below are the same either way.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
import types


def _package(name: str, path: str) -> None:
    """Register ``name`` as a package over ``path`` without running its ``__init__``."""
    module = types.ModuleType(name)
    module.__path__ = [path]
    module.__package__ = name
    sys.modules[name] = module


def _without_models() -> None:
    if "kubernetes_asyncio" in sys.modules:
        return
    found = importlib.util.find_spec("kubernetes_asyncio")
    if found is None or not found.submodule_search_locations:
        raise ImportError("kubernetes_asyncio is not installed")
    root = found.submodule_search_locations[0]
    _package("kubernetes_asyncio", root)
    _package("kubernetes_asyncio.client", f"{root}/client")
    _package("kubernetes_asyncio.client.models", f"{root}/client/models")
    # The loaders import these two from the package itself.
    client = sys.modules["kubernetes_asyncio.client"]
    api_client = importlib.import_module("kubernetes_asyncio.client.api_client")
    configuration = importlib.import_module("kubernetes_asyncio.client.configuration")
    client.ApiClient = api_client.ApiClient  # type: ignore[attr-defined]
    client.Configuration = configuration.Configuration  # type: ignore[attr-defined]


_without_models()

from kubernetes_asyncio import config as kube_config  # noqa: E402
from kubernetes_asyncio.client.api_client import ApiClient  # noqa: E402
from kubernetes_asyncio.client.configuration import Configuration  # noqa: E402
from kubernetes_asyncio.stream.ws_client import (  # noqa: E402
    ERROR_CHANNEL,
    STDOUT_CHANNEL,
    get_websocket_url,
)

__all__ = [
    "ERROR_CHANNEL",
    "STDOUT_CHANNEL",
    "ApiClient",
    "Configuration",
    "get_websocket_url",
    "kube_config",
]

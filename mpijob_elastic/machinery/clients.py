"""The controller's connections to the API server: one client for watches, one for writes.

A kubernetes_asyncio ApiClient sends every request through one aiohttp connector, whose
connection limit is its Configuration's ``connection_pool_maxsize`` (100 unless set),
read once when the ApiClient is made. A watch holds its connection for as long as it
runs, minutes at a time, and the controller keeps 12 watches open per watched namespace
(and one for Nodes). When it kept six, on one shared client, 17 namespaces took 102
connections for good: every write then
waited for a connection that never came, until its 30 s timeout, on every reconcile.

So watches and writes get a client each, made from the same loaded configuration (same
server, credentials and token refresh):

* Watches have no connection limit. The informers bound their own use, each one
  request at a time (a list or a watch), so a limit could only ever turn into the same
  silent stall again, at some larger number of namespaces.
* Writes have a pool of their own, sized by the caller to what the reconciler can have in
  flight, and a bound on how long a write may wait for a connection (a pool slot, TCP and
  TLS): a write that cannot get one fails fast with an error saying so, instead of waiting
  out its whole timeout and failing with an empty TimeoutError.

The environment's proxy for the API server (``HTTPS_PROXY``, ``NO_PROXY``, as client-go
reads them) is looked up once, at start. kubernetes_asyncio's session would look it up,
and read ``~/.netrc``, on every request, each time in a thread of the default executor:
two thread hops per write and about a tenth of the controller's CPU in a mass change
(``bench/mass.py`` under py-spy).
"""

from __future__ import annotations

import asyncio
import copy
import importlib.metadata
import urllib.parse
import urllib.request
from dataclasses import dataclass
from typing import Any

import aiohttp

from mpijob_elastic.machinery.kubeclient import ApiClient, Configuration, kube_config

# Who the controller is to the API server: every write names it as its fieldManager (so
# managedFields show which fields it set) and every request as its User-Agent (audit logs,
# the API server's request metrics). A write without a fieldManager would be recorded
# under the User-Agent's name, and kubernetes_asyncio's is "OpenAPI-Generator/...".
FIELD_MANAGER = "mpijob-elastic"
USER_AGENT = f"{FIELD_MANAGER}/{importlib.metadata.version('mpijob-elastic')}"

# Long enough for a TLS handshake with a loaded API server; a write pool that has had no
# free connection for this long is stuck, not busy (writes finish or time out in 30 s).
WRITE_CONNECT_TIMEOUT_SECONDS = 10.0


class ConfigError(Exception):
    """The configuration could not be loaded; the message is one line."""


async def load_configuration(kubeconfig: str | None) -> Any:
    """The kubeconfig's current context, or the pod's ServiceAccount when None."""
    configuration = Configuration()
    try:
        if kubeconfig:
            await kube_config.load_kube_config(
                config_file=kubeconfig, client_configuration=configuration
            )
        else:
            kube_config.load_incluster_config(client_configuration=configuration)  # type: ignore[no-untyped-call]
    # The loaders raise their own ConfigException, but also whatever a broken file makes
    # the YAML parser or their dict lookups raise: all of it means "cannot load".
    except Exception as err:
        message = " ".join(str(err).split()) or type(err).__name__
        raise ConfigError(message) from err
    return configuration


class WriteClient(ApiClient):
    """An ApiClient whose requests wait at most WRITE_CONNECT_TIMEOUT_SECONDS for a
    connection, whatever overall timeout the caller gives.

    ``request`` is where the generated client turns ``_request_timeout`` into aiohttp's
    ClientTimeout, and aiohttp's ``connect`` timeout is exactly the wait for a connection
    (from the pool or a new one); a plain number from the caller would leave it unbounded.
    """

    async def request(
        self,
        method: str,
        url: str,
        query_params: Any = None,
        headers: Any = None,
        post_params: Any = None,
        body: Any = None,
        _preload_content: bool = True,
        _request_timeout: Any = None,
    ) -> Any:
        timeout = _bounded_connect(_request_timeout)
        try:
            return await super().request(
                method, url, query_params, headers, post_params, body, _preload_content, timeout
            )
        except aiohttp.ConnectionTimeoutError as err:
            raise aiohttp.ConnectionTimeoutError(
                f"no connection to {self.configuration.host} within {timeout.connect:.0f}s: "
                f"all {self.configuration.connection_pool_maxsize} write connections are "
                "busy, or the server does not answer"
            ) from err


def _bounded_connect(request_timeout: Any) -> aiohttp.ClientTimeout:
    """The caller's timeout, as kubernetes_asyncio would read it, with connect bounded."""
    if isinstance(request_timeout, aiohttp.ClientTimeout):
        timeout = request_timeout
    elif isinstance(request_timeout, tuple):
        connect, read = request_timeout
        timeout = aiohttp.ClientTimeout(connect=connect, sock_connect=connect, sock_read=read)
    else:
        timeout = aiohttp.ClientTimeout(total=request_timeout or None)
    bound = WRITE_CONNECT_TIMEOUT_SECONDS
    return aiohttp.ClientTimeout(
        total=timeout.total,
        connect=min(timeout.connect, bound) if timeout.connect else bound,
        sock_read=timeout.sock_read,
        sock_connect=timeout.sock_connect,
        ceil_threshold=timeout.ceil_threshold,
    )


@dataclass(frozen=True)
class Clients:
    """The two clients; ``Controller(clients.write, settings, watch_api=clients.watch)``."""

    write: ApiClient
    watch: ApiClient

    async def close(self) -> None:
        await asyncio.gather(self.write.close(), self.watch.close())


def connect(configuration: Any, *, write_connections: int) -> Clients:
    """Two clients from one loaded configuration, which is left unchanged.

    Each gets a copy, because the connection limit is read from the configuration when
    the client is made; the copies share the token refresh hook, which refreshes the
    configuration it is handed. Both send USER_AGENT.
    """
    configuration = copy.deepcopy(configuration)
    if not configuration.proxy:
        configuration.proxy = environment_proxy(configuration.host)
    watch = copy.deepcopy(configuration)
    # 0 is aiohttp's "no limit".
    watch.connection_pool_maxsize = 0
    write = copy.deepcopy(configuration)
    write.connection_pool_maxsize = write_connections
    made = Clients(write=WriteClient(write), watch=ApiClient(watch))
    for client in (made.write, made.watch):
        client.user_agent = USER_AGENT
        # The proxy is the configuration's now (above); nothing else in the environment
        # is the session's to read. ``trust_env`` is read-only; its attribute is aiohttp's.
        client.rest_client.pool_manager._trust_env = False
    return made


def environment_proxy(host: str) -> str | None:
    """The proxy the environment names for the API server at ``host`` (a URL), unless
    ``NO_PROXY`` exempts it: the scheme's ``<SCHEME>_PROXY``, as client-go's
    ``ProxyFromEnvironment`` reads it."""
    url = urllib.parse.urlsplit(host)
    proxies = urllib.request.getproxies_environment()
    proxy = proxies.get(url.scheme or "https")
    if not proxy or urllib.request.proxy_bypass(url.hostname or ""):
        return None
    return proxy

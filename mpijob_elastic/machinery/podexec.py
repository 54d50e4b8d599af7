"""Run one short command in a pod's container and read its stdout, as ``kubectl exec`` does.

The controller uses this to look inside a launcher pod (which workers its remote shells
still reach), so it needs three things the usual clients do not give together:

* **Raw bytes.** The caller reads ``/proc/*/cmdline``, NUL-separated argv. The
  kubernetes_asyncio ``WsApiClient`` returns stdout only through its preloading path, which
  decodes every frame as UTF-8 (any non-UTF-8 byte raises), merges stderr into stdout and
  drops the exit status. So this module reads the websocket frames itself: each binary
  frame is one channel byte (``kubernetes_asyncio.stream`` numbers them) and data.
* **The server's refusal, word for word.** A refused exec (403, 404, 400) answers the
  websocket handshake with a plain HTTP status and a ``Status`` body, and aiohttp's
  ``ws_connect`` raises ``WSServerHandshakeError`` with the status code only, the body
  already discarded. A 403's message names the verb that was missing, which is what an
  operator needs, so the refused response's body is read by an aiohttp trace hook, before
  aiohttp discards it, and raised as ``ApiError`` like every other API failure.
* **A hard bound.** Handshake, output and close all happen before ``timeout`` expires. A
  websocket's graceful close waits (aiohttp: up to 10 s) for the server's close frame; at
  the deadline the connection is dropped instead, so a hung server cannot stretch a call.

Errors, all a caller needs to catch:

* ``ApiError(status, reason, message)`` -- the API server refused the exec: 403 (no
  ``pods/exec``), 404 (no such pod), 400 (no such container, pod not running, ...).
* ``TimeoutError`` -- the whole call took longer than ``timeout`` (the command may still
  be running in the container; the API server stops it when the stream goes away only if
  the runtime does).
* ``ExecConnectionError`` (a ``ConnectionError``, so also an ``OSError``) -- no answer
  from the API server (refused connection, TLS, DNS, proxy), the connection broke, the
  stream ended without the command's final status, so stdout may be cut short, or the
  command printed more than ``MAX_OUTPUT`` bytes (or a status of more than
  ``MAX_STATUS``): the rest is not read, and the connection is dropped.

A command that runs and exits non-zero is not an error: its stdout is returned with the
exit status (see ``ExecResult``), because commands such as ``cat /proc/[0-9]*/cmdline``
exit 1 whenever a process goes away between the glob and the read, and still print
everything the caller needs.

Calls may run concurrently from any number of tasks: each one opens its own websocket
(an upgraded connection is never shared or returned to a pool) and the session is not
limited in connections, because every call is bounded by its own timeout and waiting for a
pool slot would only turn into a TimeoutError that hides the cause.
"""

from __future__ import annotations

import asyncio
import contextvars
import copy
import json
from collections.abc import Sequence
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any
from urllib.parse import quote, urlencode

import aiohttp

from mpijob_elastic.machinery.clients import USER_AGENT, environment_proxy
from mpijob_elastic.machinery.kube import ApiError
from mpijob_elastic.machinery.kubeclient import (
    ERROR_CHANNEL,
    STDOUT_CHANNEL,
    ApiClient,
    get_websocket_url,
)

# The plain channel protocol: binary frames, first byte the channel. The API server has
# spoken it since 1.4 and its stream translator (1.30+) still does.
PROTOCOL = "v4.channel.k8s.io"
# A refusal's Status body is small; read no more of it than this.
MAX_REFUSAL_BODY = 64 * 1024
# Ceiling for one websocket frame; the API server writes output in chunks far below it.
MAX_FRAME = 4 * 1024 * 1024
# The most of a command's output kept, and of its final status. The command runs in the
# user's image, which may print for as long as the call lasts (a gigabyte in seconds);
# a launcher's process list is kilobytes (issue 31).
MAX_OUTPUT = 4 * 1024 * 1024
MAX_STATUS = 64 * 1024


class ExecConnectionError(ConnectionError):
    """The exec did not give a trustworthy answer: no connection, a broken connection, or
    a stream that ended before the command's final status."""


@dataclass(frozen=True)
class ExecResult:
    """What one exec returned.

    ``exit_code`` is 0 when the server reports success, the command's exit status when
    the kubelet reports a non-zero exit the usual way (reason ``NonZeroExitCode``), and
    None when the server reports some other failure -- the runtime could not start the
    command, or a runtime (KWOK among them) reports a non-zero exit only as an internal
    error -- in which case ``failure`` holds the server's message.
    """

    stdout: bytes
    exit_code: int | None
    failure: str | None = None

    @property
    def succeeded(self) -> bool:
        return self.exit_code == 0


@dataclass
class _Refusal:
    """Where the trace hook leaves a refused handshake's body, for the call that made it."""

    body: bytes | None = None
    reason: str = ""


# Trace hooks run in the task that makes the request, so a context variable ties the
# body to the call: concurrent calls run in different tasks and never see each other's.
_refusal: contextvars.ContextVar[_Refusal | None] = contextvars.ContextVar(
    "podexec_refusal", default=None
)


async def _keep_refusal_body(
    session: aiohttp.ClientSession,
    context: SimpleNamespace,
    params: aiohttp.TraceRequestEndParams,
) -> None:
    """Read the body of a response that refused the websocket upgrade, while it exists."""
    refusal = _refusal.get()
    response = params.response
    if refusal is None or response.status == 101:
        return
    refusal.reason = response.reason or ""
    try:
        refusal.body = await response.content.read(MAX_REFUSAL_BODY)
    except (aiohttp.ClientError, OSError):
        refusal.body = None


class PodExec:
    """Execs into pods over the API server's ``pods/exec`` websocket; ``await close()``.

    Built from the configuration ``clients.load_configuration`` returns (same server,
    credentials and token refresh), which is copied, not changed. One instance for the
    whole controller: it holds one aiohttp session and opens a connection per call.

    The ``ApiClient`` is kept for what the configuration turns into: the TLS connector
    (CA, client certificate) and the bearer token, refreshed through its hook before every
    call. The websocket goes through a session of our own over that same connector,
    because the refused-handshake hook above can only be set when a session is made.
    """

    def __init__(self, configuration: Any) -> None:
        configuration = copy.deepcopy(configuration)
        # 0 is aiohttp's "no limit"; see the module docstring.
        configuration.connection_pool_maxsize = 0
        # The environment's proxy read once (clients.py), not on every exec.
        configuration.proxy = configuration.proxy or environment_proxy(configuration.host)
        self._api = ApiClient(configuration)
        trace = aiohttp.TraceConfig()
        trace.on_request_end.append(_keep_refusal_body)
        self._session = aiohttp.ClientSession(
            connector=self._api.rest_client.pool_manager.connector,
            connector_owner=False,
            # No session-wide bound: each call's own timeout is the only one.
            timeout=aiohttp.ClientTimeout(),
            trace_configs=[trace],
        )

    async def close(self) -> None:
        await self._session.close()
        await self._api.close()

    async def __aenter__(self) -> PodExec:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def run(
        self,
        namespace: str,
        pod: str,
        container: str | None,
        command: Sequence[str],
        # A bound per call, so no caller can forget one. An outer asyncio.timeout (or any
        # cancellation) works too: _abandon drops the connection at once either way.
        timeout: float,  # noqa: ASYNC109
    ) -> ExecResult:
        """Run ``command`` (argv, no shell) in the container, return stdout and status.

        ``container`` None means the pod's only container (the server refuses with 400
        if there are several). stderr is not requested, so the server does not send it.
        Raises ``ApiError``, ``TimeoutError`` or ``ExecConnectionError``; never takes
        longer than ``timeout`` seconds.
        """
        if not command:
            raise ValueError("an exec needs a command")
        query: list[tuple[str, str]] = [("command", arg) for arg in command]
        query += [("stdout", "true"), ("stderr", "false"), ("stdin", "false"), ("tty", "false")]
        if container:
            query.append(("container", container))
        refusal = _Refusal()
        token = _refusal.set(refusal)
        ws: aiohttp.ClientWebSocketResponse[Any] | None = None
        try:
            async with asyncio.timeout(timeout):
                headers = {"User-Agent": USER_AGENT}
                # Runs the configuration's token refresh (in-cluster token file, plugins).
                await self._api.update_params_for_auth(headers, query, ["BearerToken"])
                url = self._url(namespace, pod, query)
                try:
                    ws = await self._session.ws_connect(
                        url,
                        headers=headers,
                        protocols=(PROTOCOL,),
                        # The caller's timeout bounds receiving; see _abandon for closing.
                        timeout=aiohttp.ClientWSTimeout(ws_receive=None, ws_close=timeout),
                        max_msg_size=MAX_FRAME,
                        proxy=self._api.configuration.proxy,
                        proxy_headers=self._api.configuration.proxy_headers,
                        server_hostname=self._api.configuration.tls_server_name,
                    )
                except aiohttp.WSServerHandshakeError as err:
                    if err.status == 101:
                        raise ExecConnectionError(f"exec into {namespace}/{pod}: {err}") from err
                    raise _api_error(err, refusal) from None
                return await _collect(ws, namespace, pod)
        except aiohttp.ClientError as err:
            raise ExecConnectionError(f"exec into {namespace}/{pod}: {err!r}") from err
        finally:
            _refusal.reset(token)
            if ws is not None and not ws.closed:
                await _abandon(ws)

    def _url(self, namespace: str, pod: str, query: list[tuple[str, str]]) -> str:
        path = f"/api/v1/namespaces/{quote(namespace, safe='')}/pods/{quote(pod, safe='')}/exec"
        host = str(self._api.configuration.host)
        return str(get_websocket_url(f"{host}{path}?{urlencode(query)}"))


async def _collect(
    ws: aiohttp.ClientWebSocketResponse[Any], namespace: str, pod: str
) -> ExecResult:
    """Read frames until the server closes the stream; stdout and the final status."""
    stdout = bytearray()
    try:
        return await _frames(ws, namespace, pod, stdout)
    except BaseException:
        # The error's traceback holds this frame, and so the buffer, until the cyclic
        # garbage collector runs: under a launcher that floods each read, five reads' 4 MiB
        # were alive at once (bench/exec_flood.py). Free it now.
        stdout.clear()
        raise


async def _frames(
    ws: aiohttp.ClientWebSocketResponse[Any], namespace: str, pod: str, stdout: bytearray
) -> ExecResult:
    status: bytes | None = None
    async for message in ws:
        if message.type is aiohttp.WSMsgType.ERROR:
            raise ExecConnectionError(f"exec into {namespace}/{pod}: {ws.exception()!r}")
        if message.type is not aiohttp.WSMsgType.BINARY:
            continue
        data: bytes = message.data
        if not data:
            continue
        channel, payload = data[0], data[1:]
        if channel == STDOUT_CHANNEL:
            stdout += payload
        elif channel == ERROR_CHANNEL:
            status = (status or b"") + payload
        if len(stdout) > MAX_OUTPUT or len(status or b"") > MAX_STATUS:
            raise ExecConnectionError(
                f"exec into {namespace}/{pod}: more than {MAX_OUTPUT} bytes of output or "
                f"{MAX_STATUS} of status: not read further"
            )
    # The server writes the status after the output is done, then closes. A stream that
    # ends without one was cut: the output may be incomplete.
    if status is None:
        raise ExecConnectionError(
            f"exec into {namespace}/{pod}: the stream ended without the command's status"
            f" (close code {ws.close_code})"
        )
    exit_code, failure = _parse_status(status)
    return ExecResult(bytes(stdout), exit_code, failure)


def _parse_status(raw: bytes) -> tuple[int | None, str | None]:
    """The exit code and failure message from the error channel's ``Status`` object."""
    try:
        status = json.loads(raw)
    except ValueError:
        return None, raw.decode("utf-8", "replace")
    if not isinstance(status, dict):
        return None, raw.decode("utf-8", "replace")
    if status.get("status") == "Success":
        return 0, None
    message = str(status.get("message", ""))
    if status.get("reason") == "NonZeroExitCode":
        for cause in (status.get("details") or {}).get("causes") or []:
            if cause.get("reason") == "ExitCode":
                try:
                    return int(cause.get("message")), message
                except (TypeError, ValueError):
                    break
    return None, message


def _api_error(err: aiohttp.WSServerHandshakeError, refusal: _Refusal) -> ApiError:
    """The refused handshake as the controller reports API failures: the server's Status."""
    reason = refusal.reason or "Refused"
    message = ""
    if refusal.body:
        try:
            status = json.loads(refusal.body)
        except ValueError:
            message = refusal.body.decode("utf-8", "replace")
        else:
            if isinstance(status, dict):
                reason = str(status.get("reason") or reason)
                message = str(status.get("message") or "")
    return ApiError(err.status, reason, message or err.message)


async def _abandon(ws: aiohttp.ClientWebSocketResponse[Any]) -> None:
    """Close a websocket that is still open, without waiting for the server.

    Only reached when the call is ending early (timeout, cancellation, an error). aiohttp's
    close waits for the server's close frame; cancelling that wait makes it drop the
    connection at once, which is what a call past its deadline must do.
    """
    try:
        async with asyncio.timeout(0):
            await ws.close()
    except (TimeoutError, aiohttp.ClientError, OSError):
        pass

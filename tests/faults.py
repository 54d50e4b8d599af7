"""Fault injection for integration tests: a TCP proxy in front of the API server that a test
can cut and restore, and a kubeconfig that sends a client through it.

The proxy relays bytes only, so TLS passes through untouched: the client still checks the
API server's certificate (its SANs include 127.0.0.1, the address the proxy listens on) and
the server still checks the client's. Cutting it closes every open connection and, until it
is restored, closes each new one as soon as it is accepted: a request in flight or about to
be sent is lost on the network, as in an API server restart.
"""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import yaml

_CHUNK = 65536


class TcpProxy:
    """Relays 127.0.0.1:<port> to ``target``; ``cut()`` and ``restore()`` the network."""

    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port: int = self._listener.getsockname()[1]
        self._lock = threading.Lock()
        self._open: set[socket.socket] = set()
        self._cut = False
        self._closed = False
        # Connections accepted (and at once closed) while cut: proof a client tried.
        self.refused = 0
        self._thread = threading.Thread(target=self._accept, name="tcp-proxy", daemon=True)
        self._thread.start()

    def cut(self) -> None:
        with self._lock:
            self._cut = True
            conns = list(self._open)
            self._open.clear()
        for conn in conns:
            _close(conn)

    def restore(self) -> None:
        with self._lock:
            self._cut = False

    def close(self) -> None:
        self.cut()
        self._closed = True
        _close(self._listener)
        self._thread.join(10)

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            with self._lock:
                cut = self._cut
                if cut:
                    self.refused += 1
            if cut:
                _close(client)
                continue
            threading.Thread(target=self._connect, args=(client,), daemon=True).start()

    def _connect(self, client: socket.socket) -> None:
        try:
            upstream = socket.create_connection(self.target, timeout=10)
        except OSError:
            _close(client)
            return
        upstream.settimeout(None)
        with self._lock:
            if self._cut:
                _close(client)
                _close(upstream)
                return
            self._open.update((client, upstream))
        for src, dst in ((client, upstream), (upstream, client)):
            threading.Thread(target=self._pump, args=(src, dst), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(_CHUNK):
                dst.sendall(data)
        except OSError:
            pass
        finally:
            with self._lock:
                self._open.discard(src)
                self._open.discard(dst)
            _close(src)
            _close(dst)


def _close(sock: socket.socket) -> None:
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)
    with contextlib.suppress(OSError):
        sock.close()


def api_server_address(kubeconfig: str) -> tuple[str, int]:
    server = yaml.safe_load(Path(kubeconfig).read_text())["clusters"][0]["cluster"]["server"]
    parts = urlsplit(server)
    host, port = parts.hostname, parts.port
    assert host, f"no host in {server!r}"
    assert port, f"no port in {server!r}"
    return host, port


def proxied_kubeconfig(kubeconfig: str, port: int, path: Path) -> str:
    """A copy of ``kubeconfig`` whose server is the proxy at 127.0.0.1:``port``."""
    config = yaml.safe_load(Path(kubeconfig).read_text())
    for entry in config["clusters"]:
        parts = urlsplit(entry["cluster"]["server"])
        entry["cluster"]["server"] = urlunsplit(parts._replace(netloc=f"127.0.0.1:{port}"))
    path.write_text(yaml.safe_dump(config))
    return str(path)


@contextlib.contextmanager
def tcp_proxy(kubeconfig: str) -> Iterator[TcpProxy]:
    proxy = TcpProxy(api_server_address(kubeconfig))
    try:
        yield proxy
    finally:
        proxy.close()

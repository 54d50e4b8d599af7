"""The certificate ``/metrics`` is served with (docs/operations.md, "Who may read them").

A scraper sends its ServiceAccount's bearer token with every scrape, so the endpoint speaks
TLS only: over plain HTTP the token would cross the pod network in clear. Either a mounted
certificate, ``--metrics-cert-dir`` holding ``tls.crt`` and ``tls.key`` (the names of a
``kubernetes.io/tls`` Secret, as cert-manager writes it), read again at the next TLS
handshake after either file changes, so a renewal needs no restart; or, without one, a
self-signed certificate made at start, as controller-runtime does. That one keeps the token
from being read off the wire; only a scraper that checks a CA (a mounted certificate) also
knows it is talking to the controller.
"""

from __future__ import annotations

import datetime
import logging
import os
import socket
import ssl
import tempfile
from pathlib import Path

log = logging.getLogger("mpijob_elastic.app.tls")

CERT_FILE = "tls.crt"
KEY_FILE = "tls.key"
# A self-signed certificate lives as long as the process; a year covers any process.
SELF_SIGNED_DAYS = 365


def self_signed(now: datetime.datetime) -> tuple[bytes, bytes]:
    """A certificate for this host, signed by its own key: (certificate, key), PEM."""
    # Imported here: the library costs about 10 MB of memory, which a controller without
    # /metrics, or with a mounted certificate, need not pay.
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    host = socket.gethostname()
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"mpijob-elastic {host}")])
    certificate = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=SELF_SIGNED_DAYS))
        .add_extension(x509.SubjectAlternativeName([x509.DNSName(host)]), critical=False)
        .sign(key, hashes.SHA256())
    )
    return (
        certificate.public_bytes(serialization.Encoding.PEM),
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        ),
    )


def _context(cert: Path, key: Path) -> ssl.SSLContext:
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.load_cert_chain(cert, key)
    return context


class Certificate:
    """The server's TLS context, kept current with a mounted certificate's files."""

    def __init__(self, cert_dir: Path | None) -> None:
        self._dir = cert_dir
        self._stamp: tuple[int, ...] | None = None
        if cert_dir is None:
            # ssl loads a chain from files only: written to a directory of this process's
            # own, loaded, and gone again.
            made, key = self_signed(datetime.datetime.now(datetime.UTC))
            with tempfile.TemporaryDirectory(prefix="mpijob-elastic-tls-") as tmp:
                (Path(tmp) / CERT_FILE).write_bytes(made)
                (Path(tmp) / KEY_FILE).write_bytes(key)
                self._current = _context(Path(tmp) / CERT_FILE, Path(tmp) / KEY_FILE)
            self.listening = self._current
            return
        # A certificate that cannot be read at start is a configuration error: fail loudly.
        self._current = self._load(self._files_stamp())
        self.listening = self._current
        # Each handshake starts on the listening context and moves to the current one.
        self.listening.sni_callback = self._pick

    def _files_stamp(self) -> tuple[int, ...]:
        assert self._dir is not None
        stats = [os.stat(self._dir / name) for name in (CERT_FILE, KEY_FILE)]
        return tuple(x for s in stats for x in (s.st_mtime_ns, s.st_ino, s.st_size))

    def _load(self, stamp: tuple[int, ...]) -> ssl.SSLContext:
        assert self._dir is not None
        context = _context(self._dir / CERT_FILE, self._dir / KEY_FILE)
        self._stamp = stamp
        return context

    def current(self) -> ssl.SSLContext:
        """The context of the files as they are now; the last good one while they cannot
        be read (a renewal caught half-written)."""
        if self._dir is None:
            return self._current
        try:
            stamp = self._files_stamp()
            if stamp != self._stamp:
                self._current = self._load(stamp)
                log.info("metrics certificate reloaded", extra={"dir": str(self._dir)})
        except (OSError, ssl.SSLError) as err:
            log.error(
                "cannot read the metrics certificate; serving the last one read",
                extra={"dir": str(self._dir), "error": str(err)},
            )
        return self._current

    def _pick(self, sock: ssl.SSLObject, _name: str | None, _ctx: ssl.SSLContext) -> None:
        current = self.current()
        if current is not self.listening:
            sock.context = current

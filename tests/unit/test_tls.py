"""/metrics' certificate (app/tls.py): a mounted one is served and followed through a
renewal without a restart; without one, a self-signed one is made (no cluster)."""

from __future__ import annotations

import datetime
import ipaddress
import os
import ssl
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from mpijob_elastic.app import health, tls
from tests.controller import free_port

NOW = datetime.datetime.now(datetime.UTC)


def _name(text: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, text)])


def authority(name: str) -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate]:
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (
        x509.CertificateBuilder()
        .subject_name(_name(name))
        .issuer_name(_name(name))
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(NOW - datetime.timedelta(days=1))
        .not_valid_after(NOW + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    return key, cert


def mount(directory: Path, ca: tuple[ec.EllipticCurvePrivateKey, x509.Certificate]) -> None:
    """A serving certificate for 127.0.0.1 signed by ``ca``, written as a Secret volume
    renews it: both files replaced by a rename, so no reader sees half of one."""
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (
        x509.CertificateBuilder()
        .subject_name(_name("mpijob-elastic-metrics"))
        .issuer_name(ca[1].subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(NOW - datetime.timedelta(days=1))
        .not_valid_after(NOW + datetime.timedelta(days=1))
        .add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
            critical=False,
        )
        .sign(ca[0], hashes.SHA256())
    )
    pem_key = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    for name, data in (
        (tls.CERT_FILE, cert.public_bytes(serialization.Encoding.PEM)),
        (tls.KEY_FILE, pem_key),
    ):
        (directory / f".{name}").write_bytes(data)
        os.replace(directory / f".{name}", directory / name)


def trusting(ca: x509.Certificate) -> ssl.SSLContext:
    return ssl.create_default_context(cadata=ca.public_bytes(serialization.Encoding.PEM).decode())


async def answered(port: int, context: ssl.SSLContext) -> bool:
    """Whether a scraper trusting only ``context``'s CA gets /metrics."""
    try:
        async with (
            aiohttp.ClientSession() as session,
            session.get(f"https://127.0.0.1:{port}/metrics", ssl=context) as r,
        ):
            return r.status == 200
    except aiohttp.ClientConnectorCertificateError:
        return False


async def ok(_request: web.Request) -> web.Response:
    return web.Response(text="ok\n")


async def test_a_mounted_certificate_is_served_and_followed_through_a_renewal(
    tmp_path: Path,
) -> None:
    first, second = authority("first-ca"), authority("second-ca")
    mount(tmp_path, first)
    certificate = tls.Certificate(tmp_path)
    port = free_port()
    runner = await health.serve(web.Application(), {"/metrics": ok}, port, certificate.listening)
    try:
        assert await answered(port, trusting(first[1]))
        assert not await answered(port, trusting(second[1]))
        mount(tmp_path, second)  # cert-manager renews; no restart
        assert await answered(port, trusting(second[1]))
        assert not await answered(port, trusting(first[1]))
        # A renewal caught half-way (the key gone): the last good certificate stays.
        (tmp_path / tls.KEY_FILE).unlink()
        assert await answered(port, trusting(second[1]))
    finally:
        await runner.cleanup()


def test_a_mounted_certificate_that_cannot_be_read_fails_the_start(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match=tls.CERT_FILE):
        tls.Certificate(tmp_path)


def test_without_a_mount_the_certificate_is_made_and_self_signed() -> None:
    made, key = tls.self_signed(NOW)
    cert = x509.load_pem_x509_certificate(made)
    assert cert.issuer == cert.subject
    assert cert.not_valid_after_utc - NOW > datetime.timedelta(days=300)
    assert serialization.load_pem_private_key(key, None) is not None
    assert tls.Certificate(None).listening is not None

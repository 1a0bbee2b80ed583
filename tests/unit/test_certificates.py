"""Certificates: the chain verifies (in cryptography and over real TLS), rotation, Secret, files."""

import asyncio
import base64
import datetime
import ipaddress
import os
import pathlib
import ssl
import stat

import pytest
from cryptography import x509
from cryptography.x509.verification import PolicyBuilder, Store, VerificationError

from admission_policy.config import OperatorConfig
from admission_policy.operator.certificates import (
    CA_LIFETIME,
    SERVING_LIFETIME,
    CertificateBundle,
    CertificateError,
    bundle_from_secret_data,
    bundle_to_secret_data,
    generate_bundle,
    renew,
    serving_hosts,
    write_files,
)

NOW = datetime.datetime(2025, 1, 1, tzinfo=datetime.UTC)
SETTINGS = OperatorConfig(advertise_host="192.168.49.1")
HOSTS = serving_hosts(SETTINGS)
SERVICE_HOST = "admission-policy-operator.admission-policy-system.svc"


@pytest.fixture(scope="module")
def bundle() -> CertificateBundle:
    return generate_bundle(HOSTS, NOW)


def _cert(pem: str) -> x509.Certificate:
    return x509.load_pem_x509_certificate(pem.encode())


def _verify(cert_pem: str, ca_bundle: str, host: str, at: datetime.datetime = NOW) -> None:
    """Verify the serving cert for ``host`` with cryptography's RFC 5280 web-PKI verifier."""
    store = Store(x509.load_pem_x509_certificates(ca_bundle.encode()))
    name: x509.DNSName | x509.IPAddress
    try:
        name = x509.IPAddress(ipaddress.ip_address(host))
    except ValueError:
        name = x509.DNSName(host)
    verifier = PolicyBuilder().store(store).time(at).build_server_verifier(name)
    verifier.verify(_cert(cert_pem), [])


def test_serving_hosts_cover_service_advertise_host_and_loopback() -> None:
    assert HOSTS == (
        "admission-policy-operator",
        "admission-policy-operator.admission-policy-system",
        "admission-policy-operator.admission-policy-system.svc",
        "admission-policy-operator.admission-policy-system.svc.cluster.local",
        "192.168.49.1",
        "localhost",
        "127.0.0.1",
    )


@pytest.mark.parametrize("host", HOSTS)
def test_chain_verifies_for_every_host(bundle: CertificateBundle, host: str) -> None:
    _verify(bundle.cert_pem, bundle.ca_bundle, host)


def test_chain_does_not_verify_for_other_hosts(bundle: CertificateBundle) -> None:
    with pytest.raises(VerificationError):
        _verify(bundle.cert_pem, bundle.ca_bundle, "evil.example.com")


def test_sans_and_extensions(bundle: CertificateBundle) -> None:
    cert = _cert(bundle.cert_pem)
    san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert san.get_values_for_type(x509.DNSName) == [*HOSTS[:4], "localhost"]
    assert san.get_values_for_type(x509.IPAddress) == [
        ipaddress.ip_address("192.168.49.1"),
        ipaddress.ip_address("127.0.0.1"),
    ]
    assert bundle.sans == frozenset(HOSTS)
    assert cert.extensions.get_extension_for_class(x509.BasicConstraints).value.ca is False

    ca = _cert(bundle.ca_cert_pem)
    assert ca.extensions.get_extension_for_class(x509.BasicConstraints).value.ca is True
    assert ca.extensions.get_extension_for_class(x509.KeyUsage).value.key_cert_sign is True


def test_lifetimes(bundle: CertificateBundle) -> None:
    ca, cert = _cert(bundle.ca_cert_pem), _cert(bundle.cert_pem)
    assert ca.not_valid_after_utc == NOW + CA_LIFETIME
    assert cert.not_valid_after_utc == NOW + SERVING_LIFETIME
    assert bundle.not_after == NOW + SERVING_LIFETIME
    assert cert.not_valid_before_utc < NOW  # backdated for clock skew


def test_dns_advertise_host_becomes_a_dns_san() -> None:
    hosts = serving_hosts(OperatorConfig(advertise_host="host.docker.internal"))
    dns_bundle = generate_bundle(hosts, NOW)
    _verify(dns_bundle.cert_pem, dns_bundle.ca_bundle, "host.docker.internal")


def test_naive_time_is_refused() -> None:
    with pytest.raises(ValueError, match="aware"):
        generate_bundle(HOSTS, datetime.datetime(2025, 1, 1))


async def test_tls_handshake_with_the_written_files(tmp_path: pathlib.Path) -> None:
    """What the API server does: trust caBundle, connect by service name, complete a handshake."""
    # OpenSSL checks validity against the wall clock, so this bundle is issued now.
    paths = write_files(generate_bundle(HOSTS, datetime.datetime.now(datetime.UTC)), tmp_path)
    server_ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server_ctx.load_cert_chain(paths.certfile, paths.pkeyfile)

    async def echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(await reader.readline())
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(echo, "127.0.0.1", 0, ssl=server_ctx)
    port = server.sockets[0].getsockname()[1]
    client_ctx = ssl.create_default_context(cafile=str(paths.cafile))
    async with server:
        for hostname in (SERVICE_HOST, "127.0.0.1"):
            reader, writer = await asyncio.open_connection("127.0.0.1", port, ssl=client_ctx, server_hostname=hostname)
            writer.write(b"ping\n")
            assert await reader.readline() == b"ping\n"
            writer.close()
            await writer.wait_closed()


def test_needs_renewal(bundle: CertificateBundle) -> None:
    assert not bundle.needs_renewal(NOW, HOSTS)
    assert not bundle.needs_renewal(NOW, HOSTS[:4])  # extra SANs are harmless
    two_thirds = NOW + SERVING_LIFETIME * 2 / 3
    assert not bundle.needs_renewal(two_thirds - datetime.timedelta(days=2), HOSTS)
    assert bundle.needs_renewal(two_thirds + datetime.timedelta(days=1), HOSTS)
    assert bundle.needs_renewal(NOW, [*HOSTS, "new.example.com"])
    assert bundle.needs_renewal(NOW, ["127.0.0.2"])


def test_renewal_keeps_the_old_ca_trusted(bundle: CertificateBundle) -> None:
    later = NOW + datetime.timedelta(days=300)
    renewed = renew(bundle, HOSTS, later)
    assert renewed.ca_cert_pem != bundle.ca_cert_pem
    assert renewed.previous_ca_pems == (bundle.ca_cert_pem,)
    assert renewed.ca_bundle.count("BEGIN CERTIFICATE") == 2
    assert not renewed.needs_renewal(later, HOSTS)
    # Replicas still serving the old certificate and those serving the new one are both trusted.
    _verify(bundle.cert_pem, renewed.ca_bundle, SERVICE_HOST, later)
    _verify(renewed.cert_pem, renewed.ca_bundle, SERVICE_HOST, later)


def test_renewal_drops_expired_cas(bundle: CertificateBundle) -> None:
    first = renew(bundle, HOSTS, NOW + datetime.timedelta(days=300))
    after_old_ca_expired = NOW + CA_LIFETIME + datetime.timedelta(days=1)
    second = renew(first, HOSTS, after_old_ca_expired)
    assert second.previous_ca_pems == (first.ca_cert_pem,)


def test_secret_round_trip(bundle: CertificateBundle) -> None:
    renewed = renew(bundle, HOSTS, NOW + datetime.timedelta(days=300))
    data = bundle_to_secret_data(renewed)
    assert set(data) == {"ca.crt", "ca.key", "tls.crt", "tls.key", "ca-bundle.crt"}
    assert base64.b64decode(data["ca-bundle.crt"]).decode() == renewed.ca_bundle
    assert bundle_from_secret_data(data) == renewed


def test_secret_without_a_bundle_has_no_previous_cas(bundle: CertificateBundle) -> None:
    data = bundle_to_secret_data(bundle)
    del data["ca-bundle.crt"]
    assert bundle_from_secret_data(data) == bundle


def _b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        ("tls.crt", None, "lacks tls.crt"),
        ("ca.key", "", "lacks ca.key"),
        ("tls.crt", "not base64!", "tls.crt .*base64"),
        ("ca.crt", _b64("hello"), "ca.crt is not a PEM certificate"),
        ("tls.key", _b64("-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n"), "tls.key is not"),
        ("ca-bundle.crt", _b64("garbage"), "ca-bundle.crt"),
    ],
)
def test_broken_secret_is_a_clear_error(bundle: CertificateBundle, key: str, value: str | None, message: str) -> None:
    data = bundle_to_secret_data(bundle)
    if value is None:
        del data[key]
    else:
        data[key] = value
    with pytest.raises(CertificateError, match=message):
        bundle_from_secret_data(data)


def test_mismatched_material_is_a_clear_error(bundle: CertificateBundle) -> None:
    other = generate_bundle(HOSTS, NOW)
    data = bundle_to_secret_data(bundle)
    with pytest.raises(CertificateError, match=r"tls\.key does not belong"):
        bundle_from_secret_data({**data, "tls.key": _b64(other.key_pem)})
    with pytest.raises(CertificateError, match=r"ca\.key does not belong"):
        bundle_from_secret_data({**data, "ca.key": _b64(other.ca_key_pem)})
    with pytest.raises(CertificateError, match="not issued by the CA"):
        bundle_from_secret_data({**data, "tls.crt": _b64(other.cert_pem), "tls.key": _b64(other.key_pem)})


def test_write_files_atomically(bundle: CertificateBundle, tmp_path: pathlib.Path) -> None:
    directory = tmp_path / "certs"
    paths = write_files(bundle, directory)
    assert sorted(p.name for p in directory.iterdir()) == ["ca.crt", "tls.crt", "tls.key"]
    assert paths.certfile.read_text() == bundle.cert_pem
    assert paths.pkeyfile.read_text() == bundle.key_pem
    assert paths.cafile.read_text() == bundle.ca_bundle
    assert stat.S_IMODE(paths.pkeyfile.stat().st_mode) == 0o600
    assert stat.S_IMODE(paths.certfile.stat().st_mode) == 0o644

    # Unchanged content is not rewritten (no needless reload by Kopf) ...
    inode = paths.certfile.stat().st_ino
    write_files(bundle, directory)
    assert paths.certfile.stat().st_ino == inode

    # ... changed content replaces the file (a new inode: never written in place).
    renewed = renew(bundle, HOSTS, NOW + datetime.timedelta(days=300))
    assert write_files(renewed, directory) == paths
    assert paths.certfile.stat().st_ino != inode
    assert paths.pkeyfile.read_text() == renewed.key_pem
    assert sorted(os.listdir(directory)) == ["ca.crt", "tls.crt", "tls.key"]
    assert stat.S_IMODE(paths.pkeyfile.stat().st_mode) == 0o600


def test_a_short_lifetime_is_renewed_in_its_last_third_not_at_once() -> None:
    """AP_CERT_LIFETIME=30: backdating by the full five minutes of clock skew would make a fresh
    certificate look nine tenths spent, and every check would renew it again."""
    lifetime = datetime.timedelta(seconds=30)
    bundle = generate_bundle(HOSTS, NOW, lifetime)
    assert bundle.not_after == NOW + lifetime
    ca = x509.load_pem_x509_certificate(bundle.ca_cert_pem.encode())
    assert ca.not_valid_after_utc == NOW + 2 * lifetime
    assert not bundle.needs_renewal(NOW + datetime.timedelta(seconds=15), HOSTS)
    assert bundle.needs_renewal(NOW + datetime.timedelta(seconds=22), HOSTS)
    renewed = renew(bundle, HOSTS, NOW + datetime.timedelta(seconds=22), lifetime)
    assert renewed.previous_ca_pems == (bundle.ca_cert_pem,)
    assert renewed.not_after == NOW + datetime.timedelta(seconds=52)

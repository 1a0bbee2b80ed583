"""The webhook's TLS: a private CA and a serving certificate, shared by all replicas via a Secret.

The crypto functions are pure (time is an argument) so they are tested without a cluster;
only ``ensure_certificates`` talks to Kubernetes. ``cryptography`` is used rather than Kopf's
``certbuilder`` path, whose ``oscrypto`` dependency cannot load OpenSSL >= 3.0.10.

Rotation keeps the previous CA in ``ca_bundle``: the API server keeps trusting replicas that
still serve the old certificate until they reload the new one.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import dataclasses
import datetime
import ipaddress
import logging
import os
import pathlib
import tempfile
from collections.abc import Awaitable, Iterable, Mapping, Sequence
from typing import Any, Protocol

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.asymmetric.types import PrivateKeyTypes, PublicKeyTypes
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
from kubernetes_asyncio.client.exceptions import ApiException

from admission_policy.config import OperatorConfig
from admission_policy.errors import AdmissionPolicyError

logger = logging.getLogger(__name__)

CA_LIFETIME = datetime.timedelta(days=730)
SERVING_LIFETIME = datetime.timedelta(days=365)
RENEWAL_MARGIN = 1 / 3  # renew when less than this fraction of a certificate's lifetime remains
CLOCK_SKEW = datetime.timedelta(minutes=5)  # backdate not_before for nodes with slightly slow clocks
MAX_CONFLICT_RETRIES = 5

# Keys of the Secret (and its `data`); tls.crt/tls.key make it a valid kubernetes.io/tls Secret.
CA_CERT_KEY = "ca.crt"
CA_KEY_KEY = "ca.key"
CERT_KEY = "tls.crt"
KEY_KEY = "tls.key"
CA_BUNDLE_KEY = "ca-bundle.crt"
_REQUIRED_KEYS = (CA_CERT_KEY, CA_KEY_KEY, CERT_KEY, KEY_KEY)
_MANAGED_BY = {"app.kubernetes.io/managed-by": "admission-policy-operator"}


class CertificateError(AdmissionPolicyError, ValueError):
    """The stored certificate material is missing, malformed or inconsistent."""


@dataclasses.dataclass(frozen=True)
class CertificateBundle:
    """A CA, the serving certificate it signed, and older CAs still trusted during a rotation."""

    ca_cert_pem: str
    ca_key_pem: str
    cert_pem: str
    key_pem: str
    previous_ca_pems: tuple[str, ...] = ()

    @property
    def ca_bundle(self) -> str:
        """PEM of the current and previous CAs: the webhook configurations' ``caBundle``."""
        return "".join(_ensure_newline(pem) for pem in (self.ca_cert_pem, *self.previous_ca_pems))

    @property
    def not_after(self) -> datetime.datetime:
        """When the serving certificate expires (UTC)."""
        return _load_cert(self.cert_pem).not_valid_after_utc

    @property
    def sans(self) -> frozenset[str]:
        """The serving certificate's subject alternative names, DNS names and IPs alike."""
        return _sans_of(_load_cert(self.cert_pem))

    def needs_renewal(self, now: datetime.datetime, hosts: Iterable[str], margin: float = RENEWAL_MARGIN) -> bool:
        """Renew when a certificate is in the last ``margin`` of its life, or a needed name is missing.

        Names the certificate has beyond ``hosts`` do not force a renewal: during a rolling
        upgrade that changes the hosts, two replicas must not keep re-issuing against each other.
        """
        now = _utc(now)
        for pem in (self.cert_pem, self.ca_cert_pem):
            cert = _load_cert(pem)
            lifetime = cert.not_valid_after_utc - cert.not_valid_before_utc
            if cert.not_valid_after_utc - now < lifetime * margin:
                return True
        return not {_normalise_host(h) for h in hosts} <= self.sans


@dataclasses.dataclass(frozen=True)
class CertPaths:
    """Files for ``kopf.WebhookServer(certfile=..., pkeyfile=..., cafile=...)``."""

    certfile: pathlib.Path
    pkeyfile: pathlib.Path
    cafile: pathlib.Path


class SecretsApi(Protocol):
    """The part of ``kubernetes_asyncio.client.CoreV1Api`` used here (typed for mypy)."""

    def read_namespaced_secret(self, name: str, namespace: str) -> Awaitable[Any]: ...
    def create_namespaced_secret(self, namespace: str, body: Any) -> Awaitable[Any]: ...
    def replace_namespaced_secret(self, name: str, namespace: str, body: Any) -> Awaitable[Any]: ...


def serving_hosts(settings: OperatorConfig) -> tuple[str, ...]:
    """Names the serving certificate must carry: the Service's, the advertised host, loopback."""
    hosts = [*settings.service_dns_names]
    if settings.advertise_host:
        hosts.append(settings.advertise_host)
    hosts += ["localhost", "127.0.0.1"]
    return tuple(dict.fromkeys(hosts))


def generate_bundle(hosts: Sequence[str], now: datetime.datetime,
                    lifetime: datetime.timedelta = SERVING_LIFETIME) -> CertificateBundle:
    """A fresh CA and a serving certificate for ``hosts`` (the first one is also the CN).

    The serving certificate is valid for ``lifetime``, its CA for twice that (the defaults:
    ``SERVING_LIFETIME`` and ``CA_LIFETIME``).
    """
    if not hosts:
        raise ValueError("a serving certificate needs at least one host name")
    now = _utc(now)
    # Backdating by the full CLOCK_SKEW would make a short-lived certificate look mostly spent.
    backdate = min(CLOCK_SKEW, lifetime / 10)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    # A CN unique per CA: old and new CA are trusted side by side during a rotation.
    ca_name = x509.Name(
        [
            x509.NameAttribute(NameOID.ORGANIZATION_NAME, "admission-policy-operator"),
            x509.NameAttribute(NameOID.COMMON_NAME, f"admission-policy-operator CA {now:%Y%m%dT%H%M%SZ}"),
        ]
    )
    ca_ski = x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key())
    ca_cert = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - backdate)
        .not_valid_after(now + lifetime * (CA_LIFETIME / SERVING_LIFETIME))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(_key_usage(digital_signature=True, key_cert_sign=True, crl_sign=True), critical=True)
        .add_extension(ca_ski, critical=False)
        .sign(ca_key, hashes.SHA256())
    )

    key = ec.generate_private_key(ec.SECP256R1())
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, hosts[0])]))
        .issuer_name(ca_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - backdate)
        .not_valid_after(now + lifetime)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(_key_usage(digital_signature=True), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(x509.SubjectAlternativeName(_general_names(hosts)), critical=False)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(ca_ski), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    return CertificateBundle(
        ca_cert_pem=_cert_pem(ca_cert),
        ca_key_pem=_key_pem(ca_key),
        cert_pem=_cert_pem(cert),
        key_pem=_key_pem(key),
    )


def renew(bundle: CertificateBundle, hosts: Sequence[str], now: datetime.datetime,
          lifetime: datetime.timedelta = SERVING_LIFETIME) -> CertificateBundle:
    """A new CA and serving certificate; the old CAs that have not expired stay trusted."""
    now = _utc(now)
    fresh = generate_bundle(hosts, now, lifetime)
    kept = [pem for pem in (bundle.ca_cert_pem, *bundle.previous_ca_pems) if _load_cert(pem).not_valid_after_utc > now]
    return dataclasses.replace(fresh, previous_ca_pems=tuple(dict.fromkeys(kept)))


def bundle_to_secret_data(bundle: CertificateBundle) -> dict[str, str]:
    """The Secret's ``data`` (base64 values); previous CAs live only in ``ca-bundle.crt``."""
    plain = {
        CA_CERT_KEY: bundle.ca_cert_pem,
        CA_KEY_KEY: bundle.ca_key_pem,
        CERT_KEY: bundle.cert_pem,
        KEY_KEY: bundle.key_pem,
        CA_BUNDLE_KEY: bundle.ca_bundle,
    }
    return {key: base64.b64encode(value.encode("ascii")).decode("ascii") for key, value in plain.items()}


def bundle_from_secret_data(data: Mapping[str, str]) -> CertificateBundle:
    """Parse and cross-check a Secret's ``data``; raise ``CertificateError`` naming the bad key."""
    missing = [key for key in _REQUIRED_KEYS if not data.get(key)]
    if missing:
        raise CertificateError(f"certificate Secret lacks {', '.join(missing)}")
    text = {key: _b64decode(data, key) for key in (*_REQUIRED_KEYS, CA_BUNDLE_KEY) if data.get(key)}

    ca_cert = _parse_cert(text[CA_CERT_KEY], CA_CERT_KEY)
    cert = _parse_cert(text[CERT_KEY], CERT_KEY)
    ca_key = _parse_key(text[CA_KEY_KEY], CA_KEY_KEY)
    key = _parse_key(text[KEY_KEY], KEY_KEY)
    if _public_bytes(ca_key.public_key()) != _public_bytes(ca_cert.public_key()):
        raise CertificateError(f"{CA_KEY_KEY} does not belong to the certificate in {CA_CERT_KEY}")
    if _public_bytes(key.public_key()) != _public_bytes(cert.public_key()):
        raise CertificateError(f"{KEY_KEY} does not belong to the certificate in {CERT_KEY}")
    try:
        cert.verify_directly_issued_by(ca_cert)
    except (ValueError, TypeError, InvalidSignature) as exc:
        raise CertificateError(f"{CERT_KEY} was not issued by the CA in {CA_CERT_KEY}: {exc}") from None

    previous: list[str] = []
    if CA_BUNDLE_KEY in text:
        try:
            certs = x509.load_pem_x509_certificates(text[CA_BUNDLE_KEY].encode("ascii"))
        except ValueError as exc:
            raise CertificateError(f"{CA_BUNDLE_KEY} is not a PEM certificate bundle: {exc}") from None
        previous = [_cert_pem(c) for c in certs if c != ca_cert]
    return CertificateBundle(
        ca_cert_pem=_cert_pem(ca_cert),
        ca_key_pem=text[CA_KEY_KEY],
        cert_pem=_cert_pem(cert),
        key_pem=text[KEY_KEY],
        previous_ca_pems=tuple(dict.fromkeys(previous)),
    )


def write_files(bundle: CertificateBundle, directory: str | os.PathLike[str]) -> CertPaths:
    """Write the server's files, each replaced atomically; unchanged files are left alone.

    Kopf's ``WebhookServer`` re-reads these files when their content changes, and a torn or
    mismatched pair kills it. Call this synchronously on the event loop (not in an executor):
    Kopf polls on the same loop, so it can never observe the cert updated but not the key.
    """
    root = pathlib.Path(directory)
    root.mkdir(mode=0o700, parents=True, exist_ok=True)
    paths = CertPaths(certfile=root / "tls.crt", pkeyfile=root / "tls.key", cafile=root / "ca.crt")
    _write_atomically(paths.pkeyfile, bundle.key_pem, mode=0o600)
    _write_atomically(paths.certfile, bundle.cert_pem, mode=0o644)
    _write_atomically(paths.cafile, bundle.ca_bundle, mode=0o644)
    return paths


async def ensure_certificates(api: SecretsApi, settings: OperatorConfig, now: datetime.datetime,
                              held: CertificateBundle | None = None) -> CertificateBundle:
    """Load the shared bundle from the Secret, creating or renewing it as needed.

    Replicas race safely: the first create wins (409 → re-read), and a renewal replaces with
    the read ``resourceVersion`` (409 → re-read and use the winner's bundle if it is good).
    An empty Secret (e.g. pre-created by the chart) is filled; a broken one is regenerated.
    ``held`` is the bundle this replica serves: if the Secret is gone or broken (deleted by
    hand), the new one is a renewal of it, so the CAs still in use stay trusted meanwhile.
    """
    name, namespace = settings.cert_secret, settings.namespace
    hosts = serving_hosts(settings)
    lifetime = datetime.timedelta(seconds=settings.cert_lifetime)
    for _ in range(MAX_CONFLICT_RETRIES):
        try:
            secret = await api.read_namespaced_secret(name=name, namespace=namespace)
        except ApiException as exc:
            if exc.status != 404:
                raise
            secret = None

        if secret is None:
            bundle = renew(held, hosts, now, lifetime) if held is not None else generate_bundle(hosts, now, lifetime)
            body = _secret_body(settings, bundle, secret_type="kubernetes.io/tls", resource_version=None)
            if await _conflicts(api.create_namespaced_secret(namespace=namespace, body=body)):
                continue
            logger.info("Created the webhook certificates in Secret %s/%s.", namespace, name)
            return bundle

        data: Mapping[str, str] = secret.data or {}
        try:
            current = bundle_from_secret_data(data)
        except CertificateError as exc:
            if data:
                logger.warning("Secret %s/%s is unusable (%s); issuing anew.", namespace, name, exc)
            bundle = renew(held, hosts, now, lifetime) if held is not None else generate_bundle(hosts, now, lifetime)
        else:
            if not current.needs_renewal(now, hosts):
                return current
            bundle = renew(current, hosts, now, lifetime)

        body = _secret_body(
            settings,
            bundle,
            secret_type=secret.type or "Opaque",  # a Secret's type is immutable: keep what exists
            resource_version=secret.metadata.resource_version,
        )
        if await _conflicts(api.replace_namespaced_secret(name=name, namespace=namespace, body=body)):
            continue
        logger.info("Renewed the webhook certificates in Secret %s/%s.", namespace, name)
        return bundle
    raise RuntimeError(f"Secret {namespace}/{name} kept changing during {MAX_CONFLICT_RETRIES} attempts")


async def _conflicts(call: Awaitable[Any]) -> bool:
    """Await a write; True if another writer got there first (HTTP 409)."""
    try:
        await call
    except ApiException as exc:
        if exc.status == 409:
            return True
        raise
    return False


def _secret_body(
    settings: OperatorConfig, bundle: CertificateBundle, *, secret_type: str, resource_version: str | None
) -> dict[str, Any]:
    metadata: dict[str, Any] = {
        "name": settings.cert_secret,
        "namespace": settings.namespace,
        "labels": dict(_MANAGED_BY),
    }
    if resource_version is not None:
        metadata["resourceVersion"] = resource_version
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": metadata,
        "type": secret_type,
        "data": bundle_to_secret_data(bundle),
    }


def _write_atomically(path: pathlib.Path, content: str, *, mode: int) -> None:
    data = content.encode("ascii")
    with contextlib.suppress(FileNotFoundError):
        if path.read_bytes() == data and (path.stat().st_mode & 0o777) == mode:
            return
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            os.fchmod(f.fileno(), mode)
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def _key_usage(
    *, digital_signature: bool = False, key_cert_sign: bool = False, crl_sign: bool = False
) -> x509.KeyUsage:
    return x509.KeyUsage(
        digital_signature=digital_signature,
        content_commitment=False,
        key_encipherment=False,
        data_encipherment=False,
        key_agreement=False,
        key_cert_sign=key_cert_sign,
        crl_sign=crl_sign,
        encipher_only=False,
        decipher_only=False,
    )


def _general_names(hosts: Iterable[str]) -> list[x509.GeneralName]:
    names: list[x509.GeneralName] = []
    for host in dict.fromkeys(_normalise_host(h) for h in hosts):
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            names.append(x509.DNSName(host))
    return names


def _normalise_host(host: str) -> str:
    host = host.strip().strip("[]")
    try:
        return str(ipaddress.ip_address(host))
    except ValueError:
        return host.lower()


def _sans_of(cert: x509.Certificate) -> frozenset[str]:
    try:
        ext = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return frozenset()
    dns = ext.get_values_for_type(x509.DNSName)
    ips = ext.get_values_for_type(x509.IPAddress)
    return frozenset([*(d.lower() for d in dns), *(str(ip) for ip in ips)])


def _utc(now: datetime.datetime) -> datetime.datetime:
    if now.tzinfo is None:
        raise ValueError("pass an aware datetime (e.g. datetime.now(datetime.UTC))")
    return now.astimezone(datetime.UTC)


def _ensure_newline(pem: str) -> str:
    return pem if pem.endswith("\n") else pem + "\n"


def _load_cert(pem: str) -> x509.Certificate:
    return x509.load_pem_x509_certificate(pem.encode("ascii"))


def _cert_pem(cert: x509.Certificate) -> str:
    return cert.public_bytes(serialization.Encoding.PEM).decode("ascii")


def _key_pem(key: ec.EllipticCurvePrivateKey) -> str:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    ).decode("ascii")


def _public_bytes(key: PublicKeyTypes) -> bytes:
    return key.public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)


def _b64decode(data: Mapping[str, str], key: str) -> str:
    try:
        return base64.b64decode(data[key], validate=True).decode("ascii")
    except (binascii.Error, UnicodeDecodeError):
        raise CertificateError(f"{key} in the certificate Secret is not base64-encoded PEM text") from None


def _parse_cert(pem: str, key: str) -> x509.Certificate:
    try:
        return _load_cert(pem)
    except ValueError as exc:
        raise CertificateError(f"{key} is not a PEM certificate: {exc}") from None


def _parse_key(pem: str, key: str) -> PrivateKeyTypes:
    try:
        return serialization.load_pem_private_key(pem.encode("ascii"), password=None)
    except (ValueError, TypeError) as exc:
        raise CertificateError(f"{key} is not an unencrypted PEM private key: {exc}") from None

"""``tls-secrets``: a Secret of type ``kubernetes.io/tls`` must hold certificates that parse, are
valid now (and for ``minRemainingDays`` more), and a key that matches the first of them.

CEL can check that ``data['tls.crt']`` exists, not that it is a certificate: this plugin parses
the PEM with ``cryptography``. Every certificate of the chain in ``tls.crt`` is checked for its
validity period (an expired intermediate breaks the chain as surely as an expired leaf); the
first one is the Secret's own and must match ``tls.key``. Other Secret types pass untouched.

``exemptUnchanged`` (default true): an UPDATE that leaves ``tls.crt`` and ``tls.key`` as they were
passes, so a Secret whose certificate has expired since can still have its labels, annotations
and finalizers changed — and be deleted (removing a finalizer is an UPDATE).
"""
from __future__ import annotations

import base64
import binascii
import datetime
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

from cryptography import x509
from cryptography.exceptions import UnsupportedAlgorithm
from cryptography.hazmat.primitives import serialization

from ..plugins import Failure, PluginRequest, Stage, ValidatorPlugin

TLS_TYPE = "kubernetes.io/tls"
TLS_KEYS = ("tls.crt", "tls.key")
CRT_FIELD = "data[tls.crt]"
KEY_FIELD = "data[tls.key]"


def _field(body: Mapping[str, Any], key: str) -> bytes | str:
    """The bytes of ``data[key]`` (base64), or ``stringData[key]``; a str is why it cannot be read."""
    string_data = body.get("stringData")
    if isinstance(string_data, Mapping) and isinstance(string_data.get(key), str):
        return str(string_data[key]).encode()
    data = body.get("data")
    value = data.get(key) if isinstance(data, Mapping) else None
    if not isinstance(value, str) or not value:
        return f"data[{key!r}] is missing"
    try:
        return base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError):
        return f"data[{key!r}] is not base64"


def _unchanged(request: PluginRequest) -> bool:
    """An UPDATE whose certificate and key are what the stored Secret already held."""
    if request.operation != "UPDATE":
        return False
    old = request.old_object
    if not isinstance(old, Mapping):
        return False
    return all(_field(request.object, key) == _field(old, key) for key in TLS_KEYS)


def _describe(index: int, certificate: x509.Certificate) -> str:
    try:
        subject = certificate.subject.rfc4514_string() or "no subject"
    except ValueError:
        subject = "an unreadable subject"
    return f"the certificate ({subject})" if index == 0 else f"certificate {index + 1} of the chain ({subject})"


def _validity(index: int, certificate: x509.Certificate, now: datetime.datetime, days: int) -> list[Failure]:
    starts, ends = certificate.not_valid_before_utc, certificate.not_valid_after_utc
    if now < starts:
        problem = f"is not valid before {starts.isoformat()}"
    elif now >= ends:
        problem = f"expired on {ends.isoformat()}"
    elif days and ends - now < datetime.timedelta(days=days):
        problem = f"expires on {ends.isoformat()}, within {days} days"
    else:
        return []   # the subject is named only in a failure: its text costs more than the check
    return [Failure(f"{_describe(index, certificate)} {problem}", CRT_FIELD)]


def _key_match(body: Mapping[str, Any], certificate: x509.Certificate) -> list[Failure]:
    key = _field(body, "tls.key")
    if isinstance(key, str):
        return [Failure(key, "data")]
    try:
        # Only the public halves are compared: RSA's private-key consistency checks cost 40 ms for
        # 2048 bits and seconds for 8192, past the plugin's time budget, and prove nothing here.
        private = serialization.load_pem_private_key(key, password=None, unsafe_skip_rsa_key_validation=True)
    except (ValueError, TypeError, UnsupportedAlgorithm):
        return [Failure("tls.key is not an unencrypted PEM private key of a supported type", KEY_FIELD)]
    spki, pem = serialization.PublicFormat.SubjectPublicKeyInfo, serialization.Encoding.PEM
    try:
        ours = certificate.public_key().public_bytes(pem, spki)
    except (ValueError, UnsupportedAlgorithm):
        return [Failure("the certificate's public key is of an unsupported type", CRT_FIELD)]
    if private.public_key().public_bytes(pem, spki) != ours:
        return [Failure("tls.key is not the key of the certificate in tls.crt", KEY_FIELD)]
    return []


class TLSSecrets(ValidatorPlugin):
    """Shipped with the operator and registered as anyone's plugin is (an entry point in
    pyproject.toml). Its gate is named explicitly: the derived name would be TlsSecretsPlugin."""
    name: ClassVar[str] = "tls-secrets"
    version: ClassVar[str] = "1.1.0"
    description: ClassVar[str] = ("kubernetes.io/tls Secrets must hold parseable certificates, each valid now, the "
                                  "first matching the key; an UPDATE leaving tls.crt/tls.key unchanged passes.")
    stage: ClassVar[Stage] = "Beta"
    feature_gate: ClassVar[str | None] = "TLSSecretsPlugin"
    config_schema: ClassVar[Mapping[str, Any]] = {
        "type": "object",
        "additionalProperties": False,
        "properties": {
            "minRemainingDays": {"type": "integer", "minimum": 0, "maximum": 3650,
                                 "description": "Every certificate must stay valid this many days more."},
            "requireKeyMatch": {"type": "boolean",
                                "description": "tls.key must be the first certificate's key (default true)."},
            "exemptUnchanged": {"type": "boolean",
                                "description": ("On UPDATE, a Secret whose tls.crt and tls.key are unchanged "
                                                "passes (default true): metadata, finalizers, deletion.")},
        },
    }

    def validate(self, config: Mapping[str, Any], request: PluginRequest) -> Sequence[Failure]:
        body = request.object
        if not isinstance(body, Mapping) or body.get("type") != TLS_TYPE:
            return []
        if config.get("exemptUnchanged", True) and _unchanged(request):
            return []
        crt = _field(body, "tls.crt")
        if isinstance(crt, str):
            return [Failure(crt, "data")]
        try:
            chain = x509.load_pem_x509_certificates(crt)
        except ValueError:
            return [Failure("tls.crt is not a PEM certificate", CRT_FIELD)]
        now = datetime.datetime.now(datetime.UTC)
        days = int(config.get("minRemainingDays", 0))
        failures = [failure for index, certificate in enumerate(chain)
                    for failure in _validity(index, certificate, now, days)]
        if config.get("requireKeyMatch", True):
            failures += _key_match(body, chain[0])
        return failures

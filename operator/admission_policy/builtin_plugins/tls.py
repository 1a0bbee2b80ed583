"""``tls-secrets``: a Secret of type ``kubernetes.io/tls`` must hold a certificate that parses,
is valid now (and for ``minRemainingDays`` more), and matches its private key.

CEL can check that ``data['tls.crt']`` exists, not that it is a certificate: this plugin parses
the PEM with ``cryptography``. Other Secret types pass untouched.
"""
from __future__ import annotations

import base64
import binascii
import datetime
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

from cryptography import x509
from cryptography.hazmat.primitives import serialization

from ..plugins import Failure, PluginRequest, Stage, ValidatorPlugin

TLS_TYPE = "kubernetes.io/tls"


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


class TLSSecrets(ValidatorPlugin):
    name: ClassVar[str] = "tls-secrets"
    version: ClassVar[str] = "1.0.0"
    description: ClassVar[str] = ("kubernetes.io/tls Secrets must hold a parseable certificate, valid now, "
                                  "matching its key.")
    stage: ClassVar[Stage] = "Beta"
    feature_gate: ClassVar[str | None] = "TLSSecretsPlugin"
    config_schema: ClassVar[Mapping[str, Any]] = {
        "type": "object",
        "additionalProperties": False,
        "properties": {
            "minRemainingDays": {"type": "integer", "minimum": 0, "maximum": 3650,
                                 "description": "The certificate must stay valid this many days more."},
            "requireKeyMatch": {"type": "boolean",
                                "description": "tls.key must be the certificate's key (default true)."},
        },
    }

    def validate(self, config: Mapping[str, Any], request: PluginRequest) -> Sequence[Failure]:
        body = request.object
        if not isinstance(body, Mapping) or body.get("type") != TLS_TYPE:
            return []
        crt = _field(body, "tls.crt")
        if isinstance(crt, str):
            return [Failure(crt, "data")]
        try:
            certificate = x509.load_pem_x509_certificates(crt)[0]
        except ValueError:
            return [Failure("tls.crt is not a PEM certificate", "data[tls.crt]")]
        failures = []
        now = datetime.datetime.now(datetime.UTC)
        subject = certificate.subject.rfc4514_string() or "(no subject)"
        ends = certificate.not_valid_after_utc
        if now < certificate.not_valid_before_utc:
            failures.append(Failure(f"the certificate ({subject}) is not valid before "
                                    f"{certificate.not_valid_before_utc.isoformat()}", "data[tls.crt]"))
        if now >= ends:
            failures.append(Failure(f"the certificate ({subject}) expired on {ends.isoformat()}", "data[tls.crt]"))
        else:
            days = int(config.get("minRemainingDays", 0))
            if days and ends - now < datetime.timedelta(days=days):
                failures.append(Failure(f"the certificate ({subject}) expires on {ends.isoformat()}, "
                                        f"within {days} days", "data[tls.crt]"))
        if config.get("requireKeyMatch", True):
            key = _field(body, "tls.key")
            if isinstance(key, str):
                failures.append(Failure(key, "data"))
            else:
                try:
                    private = serialization.load_pem_private_key(key, password=None)
                except (ValueError, TypeError):
                    failures.append(Failure("tls.key is not an unencrypted PEM private key", "data[tls.key]"))
                else:
                    raw = serialization.PublicFormat.SubjectPublicKeyInfo
                    pem = serialization.Encoding.PEM
                    ours = certificate.public_key().public_bytes(pem, raw)
                    if private.public_key().public_bytes(pem, raw) != ours:
                        failures.append(Failure("tls.key is not the key of the certificate in tls.crt",
                                                "data[tls.key]"))
        return failures

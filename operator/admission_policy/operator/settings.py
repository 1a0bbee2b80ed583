"""Operator settings, read once from the environment (the Helm chart sets them).

One frozen object keeps configuration out of module globals, so tests build
their own and nothing changes behind the handlers' backs at runtime.
"""

from __future__ import annotations

import dataclasses
import re
import socket
from collections.abc import Callable, Mapping
from typing import Literal, TypeVar

FailurePolicy = Literal["Fail", "Ignore"]

_T = TypeVar("_T")
_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$")
_LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
_DURATION = re.compile(r"^(\d+)\s*([smhd]?)$")
_UNITS = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}
# 30 s: a renewal (at 20 s) has 10 s left to reach every replica; 10 years: Go's x509 handles any date.
MIN_CERT_LIFETIME = 30
MAX_CERT_LIFETIME = 3650 * 86400
MAX_AUDIT_INTERVAL = 7 * 86400


@dataclasses.dataclass(frozen=True)
class OperatorSettings:
    """Everything the operator reads from its environment; defaults suit the Helm chart."""

    namespace: str = "admission-policy-system"
    service_name: str = "admission-policy-operator"
    service_port: int = 443
    listen_host: str = "0.0.0.0"
    listen_port: int = 9443
    advertise_host: str = ""  # "" = in-cluster Service; set = `url` client config (local dev)
    advertise_port: int = 0   # the port in that url; 0 = listen_port (differs behind a local proxy)
    webhook_timeout: int = 5
    max_connections: int = 256  # open webhook connections at most (~280 KB each)
    exempt_namespaces: tuple[str, ...] = ("kube-system",)
    default_failure_policy: FailurePolicy = "Fail"
    metrics_port: int = 8080  # 0 disables the metrics endpoint
    health_port: int = 8081
    log_level: str = "INFO"
    cert_secret: str = "admission-policy-operator-tls"
    cert_dir: str = "/tmp/admission-policy-operator/certs"
    # Seconds the serving certificate is valid (its CA: twice that); renewed with a third left.
    # Shorter than the default only for compliance rules or tests that watch a rotation happen.
    cert_lifetime: int = 365 * 24 * 3600
    webhook_config_name: str = "admission-policy-operator"
    pod_name: str = dataclasses.field(default_factory=socket.gethostname)
    peering_name: str = "admission-policy-operator"
    feature_gates: str = ""   # Name=true,Other=false (admission_policy.features)
    # The background audit (operator/audit.py): seconds between scans of each policy (0: no
    # scans), objects per list page (what the scan holds at once), violations listed in status.
    audit_interval: int = 300
    audit_page_size: int = 500
    audit_violations_limit: int = 20

    @classmethod
    def from_env(cls, environ: Mapping[str, str]) -> OperatorSettings:
        """Read ``AP_*`` variables; an empty value means the default (Helm renders unset as "")."""
        d = cls()
        return cls(
            namespace=_get(environ, "AP_NAMESPACE", d.namespace, _dns_label),
            service_name=_get(environ, "AP_SERVICE_NAME", d.service_name, _dns_label),
            service_port=_get(environ, "AP_SERVICE_PORT", d.service_port, _int_range(1, 65535)),
            listen_host=_get(environ, "AP_LISTEN_HOST", d.listen_host, _text),
            listen_port=_get(environ, "AP_LISTEN_PORT", d.listen_port, _int_range(1, 65535)),
            advertise_host=_get(environ, "AP_ADVERTISE_HOST", d.advertise_host, _host),
            advertise_port=_get(environ, "AP_ADVERTISE_PORT", d.advertise_port, _int_range(0, 65535)),
            webhook_timeout=_get(environ, "AP_WEBHOOK_TIMEOUT", d.webhook_timeout, _int_range(1, 30)),
            max_connections=_get(environ, "AP_MAX_CONNECTIONS", d.max_connections, _int_range(1, 65535)),
            # Unlike the others, an explicitly empty list is meaningful: "exempt nothing extra".
            exempt_namespaces=(
                _namespace_list(environ["AP_EXEMPT_NAMESPACES"], "AP_EXEMPT_NAMESPACES")
                if "AP_EXEMPT_NAMESPACES" in environ
                else d.exempt_namespaces
            ),
            default_failure_policy=_get(
                environ, "AP_DEFAULT_FAILURE_POLICY", d.default_failure_policy, _failure_policy
            ),
            metrics_port=_get(environ, "AP_METRICS_PORT", d.metrics_port, _int_range(0, 65535)),
            health_port=_get(environ, "AP_HEALTH_PORT", d.health_port, _int_range(1, 65535)),
            log_level=_get(environ, "AP_LOG_LEVEL", d.log_level, _log_level),
            cert_secret=_get(environ, "AP_CERT_SECRET", d.cert_secret, _dns_subdomain),
            cert_dir=_get(environ, "AP_CERT_DIR", d.cert_dir, _text),
            cert_lifetime=_get(environ, "AP_CERT_LIFETIME", d.cert_lifetime,
                               _duration(MIN_CERT_LIFETIME, MAX_CERT_LIFETIME)),
            webhook_config_name=_get(environ, "AP_WEBHOOK_CONFIG_NAME", d.webhook_config_name, _dns_subdomain),
            pod_name=_get(environ, "AP_POD_NAME", d.pod_name, _text),
            peering_name=_get(environ, "AP_PEERING_NAME", d.peering_name, _dns_subdomain),
            feature_gates=_get(environ, "AP_FEATURE_GATES", d.feature_gates, _feature_gates),
            audit_interval=_get(environ, "AP_AUDIT_INTERVAL", d.audit_interval, _duration(0, MAX_AUDIT_INTERVAL)),
            audit_page_size=_get(environ, "AP_AUDIT_PAGE_SIZE", d.audit_page_size, _int_range(1, 10_000)),
            audit_violations_limit=_get(environ, "AP_AUDIT_VIOLATIONS_LIMIT", d.audit_violations_limit,
                                        _int_range(0, 500)),
        )

    @property
    def advertised_url(self) -> str:
        """``https://HOST:PORT`` of the `url` client config; "" in-cluster."""
        if not self.advertise_host:
            return ""
        host = f"[{self.advertise_host}]" if ":" in self.advertise_host else self.advertise_host  # IPv6 literal
        return f"https://{host}:{self.advertise_port or self.listen_port}"

    @property
    def evaluation_deadline(self) -> float:
        """Seconds a request may spend in the engine: answered (by failurePolicy) before the API
        server's own webhook timeout gives up on it and every other request queued behind it."""
        return self.webhook_timeout - min(1.0, self.webhook_timeout / 5)

    @property
    def cert_check_interval(self) -> float:
        """Seconds between checks of the certificate Secret: a tenth of the lifetime, at most
        hourly, so that a renewal always happens well inside its last third."""
        return min(3600.0, self.cert_lifetime / 10)

    @property
    def cert_switch_grace(self) -> float:
        """Seconds between writing a new CA into the webhook configurations and serving a
        certificate it signed: time for every API server's informer to see the new caBundle."""
        return min(5.0, self.cert_lifetime / 10)

    @property
    def all_exempt_namespaces(self) -> tuple[str, ...]:
        """The configured exemptions plus our own namespace, so the operator never gates itself."""
        return tuple(sorted({*self.exempt_namespaces, self.namespace}))

    @property
    def service_dns_names(self) -> tuple[str, ...]:
        """Every name the API server may use to reach the Service (all go in the serving cert)."""
        svc, ns = self.service_name, self.namespace
        return (svc, f"{svc}.{ns}", f"{svc}.{ns}.svc", f"{svc}.{ns}.svc.cluster.local")


def _feature_gates(raw: str, name: str) -> str:
    from .. import features
    try:
        features.parse(raw)
    except features.FeatureGateError as exc:
        raise ValueError(f"{name}: {exc}") from None
    return raw


def _get(environ: Mapping[str, str], name: str, default: _T, parse: Callable[[str, str], _T]) -> _T:
    raw = environ.get(name, "").strip()
    return default if not raw else parse(raw, name)


def _int_range(low: int, high: int) -> Callable[[str, str], int]:
    def parse(raw: str, name: str) -> int:
        try:
            value = int(raw)
        except ValueError:
            raise ValueError(f"{name}={raw!r}: expected an integer from {low} to {high}") from None
        if not low <= value <= high:
            raise ValueError(f"{name}={raw!r}: expected an integer from {low} to {high}")
        return value

    return parse


def _duration(low: int, high: int) -> Callable[[str, str], int]:
    """Seconds, given as a number of seconds or with a unit: ``30s``, ``15m``, ``12h``, ``90d``."""
    def parse(raw: str, name: str) -> int:
        match = _DURATION.match(raw.lower())
        value = int(match[1]) * _UNITS[match[2]] if match else None
        if value is None or not low <= value <= high:
            raise ValueError(f"{name}={raw!r}: expected a duration from {low}s to {high // 86400}d "
                             "(seconds, or a number with s, m, h or d)")
        return value

    return parse


def _text(raw: str, name: str) -> str:
    return raw


def _dns_label(raw: str, name: str) -> str:
    if not _DNS_LABEL.match(raw):
        raise ValueError(f"{name}={raw!r}: expected a DNS label (lowercase letters, digits, '-')")
    return raw


def _dns_subdomain(raw: str, name: str) -> str:
    if not _DNS_SUBDOMAIN.match(raw):
        raise ValueError(f"{name}={raw!r}: expected a DNS subdomain (lowercase letters, digits, '-', '.')")
    return raw


def _host(raw: str, name: str) -> str:
    host = raw[1:-1] if raw.startswith("[") and raw.endswith("]") else raw
    if not host or any(c in host for c in "/ @?#") or host.count(":") == 1:
        raise ValueError(f"{name}={raw!r}: expected a bare host name or IP address, no scheme or port")
    return host


def _namespace_list(raw: str, name: str) -> tuple[str, ...]:
    items = [item.strip() for item in raw.split(",") if item.strip()]
    for item in items:
        if not _DNS_LABEL.match(item):
            raise ValueError(f"{name}={raw!r}: {item!r} is not a valid namespace name")
    return tuple(dict.fromkeys(items))


def _failure_policy(raw: str, name: str) -> FailurePolicy:
    if raw.lower() == "fail":
        return "Fail"
    if raw.lower() == "ignore":
        return "Ignore"
    raise ValueError(f"{name}={raw!r}: expected Fail or Ignore")


def _log_level(raw: str, name: str) -> str:
    if raw.upper() not in _LOG_LEVELS:
        raise ValueError(f"{name}={raw!r}: expected one of {', '.join(_LOG_LEVELS)}")
    return raw.upper()

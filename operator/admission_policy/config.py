"""Operator settings, read once from the environment (the Helm chart sets them).

Beside the engine rather than in ``operator/``: the CLI reads the same settings (the namespaces
the operator exempts, break-glass, defaults) to give the same answers, without the Kopf glue.

One frozen object keeps configuration out of module globals, so tests build
their own and nothing changes behind the handlers' backs at runtime.

Each field carries its :class:`Setting` (environment variable, ``admission-policy run`` flag,
parser, meaning), so that ``from_env``, the flags of ``run`` and docs/configuration.md are one
list and cannot drift apart. Regenerate the page after changing a setting::

    python -m admission_policy.config > docs/configuration.md
"""

from __future__ import annotations

import dataclasses
import re
import socket
from collections.abc import Callable, Mapping
from typing import Any, Final

from .api import FailurePolicy
from .cluster.routing import BREAK_GLASS_LABEL

Parser = Callable[[str, str], Any]   # (value, variable name) -> value; its ValueError names the variable

_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$")
_LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
_DURATION = re.compile(r"^(\d+)\s*([smhd]?)$")
_UNITS = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}
# 30 s: a renewal (at 20 s) has 10 s left to reach every replica; 10 years: Go's x509 handles any date.
MIN_CERT_LIFETIME = 30
MAX_CERT_LIFETIME = 3650 * 86400
MAX_AUDIT_INTERVAL = 7 * 86400
_METADATA_KEY = "setting"


@dataclasses.dataclass(frozen=True)
class Setting:
    """How one field of :class:`OperatorConfig` is given from outside, and what it means."""

    env: str                        # what the chart sets
    flag: str                       # `admission-policy run`'s option; it sets the variable
    help: str                       # `run --help` and the docs table
    parse: Parser
    details: str = ""               # the docs table only: what the operator does with it
    default_text: str = ""          # Markdown, where the value says it badly: "`365d`", not 31536000
    empty_is_a_value: bool = False  # "" means an empty value, not the default


# --- parsers: (raw text, variable name) -> value; a ValueError names the variable and what it expects ---

def _int_range(low: int, high: int) -> Parser:
    def parse(raw: str, name: str) -> int:
        try:
            value = int(raw)
        except ValueError:
            raise ValueError(f"{name}={raw!r}: expected an integer from {low} to {high}") from None
        if not low <= value <= high:
            raise ValueError(f"{name}={raw!r}: expected an integer from {low} to {high}")
        return value

    return parse


def _duration(low: int, high: int) -> Parser:
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


def _comma_list(pattern: re.Pattern[str], what: str) -> Parser:
    """Comma-separated names, each matching ``pattern``; duplicates dropped, order kept."""
    def parse(raw: str, name: str) -> tuple[str, ...]:
        items = [item.strip() for item in raw.split(",") if item.strip()]
        for item in items:
            if not pattern.match(item):
                raise ValueError(f"{name}={raw!r}: {item!r} is not {what}")
        return tuple(dict.fromkeys(items))
    return parse


_namespace_list = _comma_list(_DNS_LABEL, "a valid namespace name")
# Kubernetes user and group names are free text; a comma separates them here, and a control
# character could only be a mistake.
_identity_list = _comma_list(re.compile(r"^[^\x00-\x1f\x7f,]+$"), "a user or group name")
_plugin_list = _comma_list(_DNS_SUBDOMAIN, "a plugin name")


def _native_mode(raw: str, name: str) -> str:
    if raw not in ("Auto", "Never"):
        raise ValueError(f"{name}={raw!r}: expected Auto or Never")
    return raw


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


def _feature_gates(raw: str, name: str) -> str:
    from . import features
    try:
        features.parse(raw)
    except features.FeatureGateError as exc:
        raise ValueError(f"{name}: {exc}") from None
    return raw


def _setting(env: str, parse: Parser, help: str, *, details: str = "", default_text: str = "",
             empty_is_a_value: bool = False) -> dict[str, Setting]:
    """A field's metadata. Its flag is the variable without ``AP_`` (``--cert-lifetime``), the
    names `run` has always taken."""
    flag = "--" + env.removeprefix("AP_").lower().replace("_", "-")
    return {_METADATA_KEY: Setting(env, flag, help, parse, details, default_text, empty_is_a_value)}


@dataclasses.dataclass(frozen=True)
class OperatorConfig:
    """Everything the operator reads from its environment; defaults suit the Helm chart."""

    namespace: str = dataclasses.field(default="admission-policy-system", metadata=_setting(
        "AP_NAMESPACE", _dns_label, "Namespace the operator runs in: its certificate Secret and hand-off "
        "ConfigMaps; always exempt from its own webhooks."))
    service_name: str = dataclasses.field(default="admission-policy-operator", metadata=_setting(
        "AP_SERVICE_NAME", _dns_label, "Service that fronts the webhook, in-cluster."))
    service_port: int = dataclasses.field(default=443, metadata=_setting(
        "AP_SERVICE_PORT", _int_range(1, 65535), "Port of that Service."))
    listen_host: str = dataclasses.field(default="0.0.0.0", metadata=_setting(
        "AP_LISTEN_HOST", _text, "Address the HTTPS webhook server listens on."))
    listen_port: int = dataclasses.field(default=9443, metadata=_setting(
        "AP_LISTEN_PORT", _int_range(1, 65535), "Port the HTTPS webhook server listens on."))
    advertise_host: str = dataclasses.field(default="", metadata=_setting(
        "AP_ADVERTISE_HOST", _host, "Host the API server reaches when the operator runs outside the cluster: "
        "the webhooks then use `url: https://HOST:PORT/...` instead of the Service.", default_text="none"))
    advertise_port: int = dataclasses.field(default=0, metadata=_setting(
        "AP_ADVERTISE_PORT", _int_range(0, 65535), "Port in that url, when not the listen port (e.g. behind a "
        "proxy).", default_text="the listen port"))
    webhook_timeout: int = dataclasses.field(default=5, metadata=_setting(
        "AP_WEBHOOK_TIMEOUT", _int_range(1, 30), "timeoutSeconds of the webhooks (1-30).",
        details="Also how long a request's body may take to arrive."))
    max_connections: int = dataclasses.field(default=256, metadata=_setting(
        "AP_MAX_CONNECTIONS", _int_range(1, 65535), "Open webhook connections at most; the longest idle "
        "makes room.", details="Each takes about 75 KB idle (40 KB while handshaking). At the cap a new "
        "connection closes, oldest first, one that has sent no request for 2 s or more, else one idle between "
        "requests for 2 s or more (the API server reuses connections that just answered), else one that has "
        "sent no request yet; it is refused only when every connection is busy or answered in the last 2 s."))
    exempt_namespaces: tuple[str, ...] = dataclasses.field(default=("kube-system",), metadata=_setting(
        "AP_EXEMPT_NAMESPACES", _namespace_list, "Comma-separated namespaces never sent to the webhooks.",
        details="The operator's own namespace is always added; an empty value exempts no other.",
        empty_is_a_value=True))
    # Break-glass (docs/operations.md, "Break-glass"): decided by the API server, so it works with
    # every replica down, and only for identities the cluster admin names here.
    break_glass_groups: tuple[str, ...] = dataclasses.field(default=("system:masters",), metadata=_setting(
        "AP_BREAK_GLASS_GROUPS", _identity_list, f"Comma-separated groups whose writes of objects labelled "
        f"`{BREAK_GLASS_LABEL}=true` no webhook judges.",
        details="The webhooks' `matchConditions` skip such a write when the requester is in one of these groups "
        "or is one of `AP_BREAK_GLASS_USERS`; anyone else's write is judged, label or not. An empty value names "
        "no group.", empty_is_a_value=True))
    break_glass_users: tuple[str, ...] = dataclasses.field(default=(), metadata=_setting(
        "AP_BREAK_GLASS_USERS", _identity_list, "Comma-separated user names (ServiceAccounts as "
        "`system:serviceaccount:NS:NAME`) with the same break-glass.",
        details="The chart adds the operator's own ServiceAccount.", default_text="none"))
    default_failure_policy: FailurePolicy = dataclasses.field(default="Fail", metadata=_setting(
        "AP_DEFAULT_FAILURE_POLICY", _failure_policy, "failurePolicy of policies that set none: Fail or Ignore."))
    native_default: str = dataclasses.field(default="Auto", metadata=_setting(
        "AP_NATIVE_DEFAULT", _native_mode, "Auto or Never: whether a policy without spec.native is enforced "
        "by Kubernetes itself when it can be (docs/vap.md, \"Native enforcement\").",
        details="Auto: a policy whose rules Kubernetes can run becomes a ValidatingAdmissionPolicy and binding, "
        "which keep enforcing with every replica down, and the webhooks stop judging it; Never: the webhooks "
        "judge every policy. A policy's `spec.native` overrides it."))
    metrics_port: int = dataclasses.field(default=8080, metadata=_setting(
        "AP_METRICS_PORT", _int_range(0, 65535), "Port of Prometheus /metrics (0 disables)."))
    health_port: int = dataclasses.field(default=8081, metadata=_setting(
        "AP_HEALTH_PORT", _int_range(1, 65535), "Port of /healthz and /readyz.",
        details="/readyz: ready once policies are loaded and the server listens; it stays ready while the API "
        "server is unreachable (the last policy set keeps being served) and its body says for how long a watch "
        "has been down. Both answer 503, naming it, when a background task that admission depends on keeps "
        "dying (docs/design.md, \"Background tasks\")."))
    log_level: str = dataclasses.field(default="INFO", metadata=_setting(
        "AP_LOG_LEVEL", _log_level, "DEBUG, INFO, WARNING or ERROR.",
        details="Policy transitions are INFO lines naming the policy; so is each denial, warning and audit "
        "finding (policy, operation, object, user, message; at most 10 lines per policy per minute, then a "
        "count of those suppressed, dry runs marked); every decision, and Kopf's per-object lines, only at "
        "DEBUG. HTTP client libraries stay at WARNING at any level: no line carries Secret data."))
    cert_secret: str = dataclasses.field(default="admission-policy-operator-tls", metadata=_setting(
        "AP_CERT_SECRET", _dns_subdomain, "Secret holding the shared CA and serving certificate."))
    cert_dir: str = dataclasses.field(default="/tmp/admission-policy-operator/certs", metadata=_setting(
        "AP_CERT_DIR", _text, "Directory for the serving certificate files."))
    # Shorter than the default only for compliance rules or tests that watch a rotation happen.
    cert_lifetime: int = dataclasses.field(default=365 * 86400, metadata=_setting(
        "AP_CERT_LIFETIME", _duration(MIN_CERT_LIFETIME, MAX_CERT_LIFETIME), "Validity of the serving "
        "certificate (30s..3650d; its CA lasts twice as long), renewed, CA included, with a third left.",
        details="The Secret is checked every tenth of the lifetime (at most hourly), and every replica adopts "
        "a renewal as soon as the Secret changes. Short values are for tests that watch a rotation.",
        default_text="`365d`"))
    webhook_config_name: str = dataclasses.field(default="admission-policy-operator", metadata=_setting(
        "AP_WEBHOOK_CONFIG_NAME", _dns_subdomain, "Name of both webhook configurations."))
    pod_name: str = dataclasses.field(default_factory=socket.gethostname, metadata=_setting(
        "AP_POD_NAME", _text, "This replica's name: its Kopf peering priority and its audit hand-off "
        "ConfigMap derive from it.", default_text="the host name"))
    peering_name: str = dataclasses.field(default="admission-policy-operator", metadata=_setting(
        "AP_PEERING_NAME", _dns_subdomain, "ClusterKopfPeering object by which replicas agree on the one "
        "that reconciles."))
    feature_gates: str = dataclasses.field(default="", metadata=_setting(
        "AP_FEATURE_GATES", _feature_gates, "Comma-separated Name=true|false; see `admission-policy plugins` "
        "for the gates and their defaults.", details="An unknown gate stops the operator at startup.",
        default_text="every gate at its default"))
    # The background audit (operator/audit.py).
    audit_interval: int = dataclasses.field(default=300, metadata=_setting(
        "AP_AUDIT_INTERVAL", _duration(0, MAX_AUDIT_INTERVAL), "Time between background scans of each "
        "policy's existing objects (seconds, or 30s, 5m, 1h; at most 7d; 0 disables).",
        details="A policy's new generation is scanned at once.", default_text="`5m`"))
    audit_page_size: int = dataclasses.field(default=500, metadata=_setting(
        "AP_AUDIT_PAGE_SIZE", _int_range(1, 10_000), "Objects per list page in the background scan "
        "(1-10000): what a scan holds in memory at once."))
    audit_violations_limit: int = dataclasses.field(default=20, metadata=_setting(
        "AP_AUDIT_VIOLATIONS_LIMIT", _int_range(0, 500), "Violations listed in each policy's "
        "status.audit.firstViolations (0-500; status.audit.violations always counts all)."))

    # NamespacedAdmissionPolicies: what a namespace's admins may add (docs/tenant-policies.md).
    tenant_max_policies: int = dataclasses.field(default=20, metadata=_setting(
        "AP_TENANT_MAX_POLICIES", _int_range(0, 10_000), "NamespacedAdmissionPolicies one namespace may hold "
        "(0 forbids them); one more is refused at `kubectl apply`."))
    tenant_max_cost: int = dataclasses.field(default=200_000_000, metadata=_setting(
        "AP_TENANT_MAX_COST", _int_range(0, 10**15), "Estimated CEL cost of all of one namespace's "
        "NamespacedAdmissionPolicies together, on a 64 KiB request; over it, a policy is refused at apply.",
        details="The same estimate that decides when a policy runs in a process of its own: an upper bound, "
        "so that one tenant's rules cannot slow every request routed to the webhook. The default is four "
        "policies at the per-policy budget."))
    tenant_plugins: tuple[str, ...] = dataclasses.field(default=(), metadata=_setting(
        "AP_TENANT_PLUGINS", _plugin_list, "Comma-separated plugins NamespacedAdmissionPolicies may call "
        "(feature gates still apply); others are refused at apply.", default_text="none"))

    @classmethod
    def from_env(cls, environ: Mapping[str, str]) -> OperatorConfig:
        """Read ``AP_*`` variables; an empty value means the default (Helm renders unset as ""),
        except for a setting whose empty value means something ("exempt nothing extra")."""
        given: dict[str, Any] = {}
        for name, setting in SETTINGS.items():
            raw = environ.get(setting.env)
            if raw is not None and setting.empty_is_a_value:
                given[name] = setting.parse(raw, setting.env)
            elif raw is not None and raw.strip():
                given[name] = setting.parse(raw.strip(), setting.env)
        return cls(**given)

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


SETTINGS: Final[Mapping[str, Setting]] = {
    field.name: field.metadata[_METADATA_KEY] for field in dataclasses.fields(OperatorConfig)
}


def default_text(name: str) -> str:
    """A field's default as Markdown, as one would give it: ``kube-system``, ``365d``, the host name."""
    setting = SETTINGS[name]
    if setting.default_text:
        return setting.default_text
    value = getattr(OperatorConfig, name)
    return f"`{','.join(value) if isinstance(value, tuple) else value}`"


def markdown_table() -> str:
    """docs/configuration.md: every setting's variable, flag, default and meaning."""
    rows = [[f"`{s.env}`", f"`{s.flag}`", default_text(name), " ".join(filter(None, (s.help, s.details)))]
            for name, s in SETTINGS.items()]
    empty = [f"`{s.env}`" for s in SETTINGS.values() if s.empty_is_a_value]
    empty_is_a_value = f"{', '.join(empty[:-1])} and {empty[-1]}" if len(empty) > 1 else "".join(empty)
    return "\n".join([
        "# Configuration",
        "",
        "<!-- Generated from operator/admission_policy/config.py: do not edit. Regenerate with",
        "     python -m admission_policy.config > docs/configuration.md -->",
        "",
        "The operator reads its settings from environment variables (what the Helm chart sets), or from the",
        "flags of `admission-policy run`, which win over them. An empty variable means the default, except",
        f"{empty_is_a_value} (see {'their meanings' if len(empty) > 1 else 'its meaning'}). "
        "`admission-policy audit --kubeconfig` reads them too, to skip the namespaces the operator skips.",
        "",
        "| variable | flag | default | meaning |",
        "| --- | --- | --- | --- |",
        *("| " + " | ".join(cell.replace("|", "\\|") for cell in row) + " |" for row in rows),
        "",
    ])


if __name__ == "__main__":
    print(markdown_table(), end="")

"""OperatorConfig.from_env: defaults, parsing, and errors that name the variable."""

import socket
from pathlib import Path

import pytest

from admission_policy.config import SETTINGS, OperatorConfig, default_text, markdown_table

ROOT = Path(__file__).resolve().parents[2]


def test_defaults_from_an_empty_environment() -> None:
    settings = OperatorConfig.from_env({})
    assert settings.namespace == "admission-policy-system"
    assert settings.service_name == "admission-policy-operator"
    assert settings.service_port == 443
    assert settings.listen_host == "0.0.0.0"
    assert settings.listen_port == 9443
    assert settings.advertise_host == ""
    assert settings.webhook_timeout == 5
    assert settings.exempt_namespaces == ("kube-system",)
    assert settings.default_failure_policy == "Fail"
    assert settings.metrics_port == 8080
    assert settings.health_port == 8081
    assert settings.log_level == "INFO"
    assert settings.cert_secret == "admission-policy-operator-tls"
    assert settings.cert_dir == "/tmp/admission-policy-operator/certs"
    assert settings.webhook_config_name == "admission-policy-operator"
    assert settings.pod_name == socket.gethostname()
    assert settings.peering_name == "admission-policy-operator"


def test_every_variable_is_read() -> None:
    settings = OperatorConfig.from_env(
        {
            "AP_NAMESPACE": "policies",
            "AP_SERVICE_NAME": "webhook",
            "AP_SERVICE_PORT": "8443",
            "AP_LISTEN_HOST": "127.0.0.1",
            "AP_LISTEN_PORT": "10443",
            "AP_ADVERTISE_HOST": "host.docker.internal",
            "AP_WEBHOOK_TIMEOUT": "30",
            "AP_EXEMPT_NAMESPACES": " kube-system, cert-manager ,,",
            "AP_DEFAULT_FAILURE_POLICY": "ignore",
            "AP_METRICS_PORT": "0",
            "AP_HEALTH_PORT": "9000",
            "AP_LOG_LEVEL": "debug",
            "AP_CERT_SECRET": "tls",
            "AP_CERT_DIR": "/certs",
            "AP_WEBHOOK_CONFIG_NAME": "my-policies",
            "AP_POD_NAME": "operator-0",
            "AP_PEERING_NAME": "peers",
        }
    )
    assert settings == OperatorConfig(
        namespace="policies",
        service_name="webhook",
        service_port=8443,
        listen_host="127.0.0.1",
        listen_port=10443,
        advertise_host="host.docker.internal",
        webhook_timeout=30,
        exempt_namespaces=("kube-system", "cert-manager"),
        default_failure_policy="Ignore",
        metrics_port=0,
        health_port=9000,
        log_level="DEBUG",
        cert_secret="tls",
        cert_dir="/certs",
        webhook_config_name="my-policies",
        pod_name="operator-0",
        peering_name="peers",
    )


def test_empty_values_mean_defaults_except_the_exempt_list() -> None:
    settings = OperatorConfig.from_env({"AP_SERVICE_PORT": "", "AP_EXEMPT_NAMESPACES": ""})
    assert settings.service_port == 443
    assert settings.exempt_namespaces == ()
    assert settings.all_exempt_namespaces == ("admission-policy-system",)


def test_operator_namespace_is_always_exempt() -> None:
    settings = OperatorConfig.from_env({"AP_NAMESPACE": "ops", "AP_EXEMPT_NAMESPACES": "kube-system,ops"})
    assert settings.all_exempt_namespaces == ("kube-system", "ops")


def test_service_dns_names() -> None:
    settings = OperatorConfig(namespace="ns", service_name="svc")
    assert settings.service_dns_names == ("svc", "svc.ns", "svc.ns.svc", "svc.ns.svc.cluster.local")


def test_bracketed_ipv6_advertise_host_is_unwrapped() -> None:
    assert OperatorConfig.from_env({"AP_ADVERTISE_HOST": "[::1]"}).advertise_host == "::1"


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("AP_SERVICE_PORT", "https"),
        ("AP_SERVICE_PORT", "0"),
        ("AP_LISTEN_PORT", "70000"),
        ("AP_WEBHOOK_TIMEOUT", "0"),
        ("AP_WEBHOOK_TIMEOUT", "31"),
        ("AP_METRICS_PORT", "-1"),
        ("AP_HEALTH_PORT", "0"),
        ("AP_DEFAULT_FAILURE_POLICY", "Deny"),
        ("AP_LOG_LEVEL", "LOUD"),
        ("AP_NAMESPACE", "Not_A_Namespace"),
        ("AP_EXEMPT_NAMESPACES", "kube-system,bad name"),
        ("AP_ADVERTISE_HOST", "https://example.com"),
        ("AP_ADVERTISE_HOST", "example.com:9443"),
        ("AP_CERT_SECRET", "UPPER"),
    ],
)
def test_bad_values_name_the_variable(name: str, value: str) -> None:
    with pytest.raises(ValueError, match=name):
        OperatorConfig.from_env({name: value})


def test_evaluation_ends_before_the_api_server_stops_waiting() -> None:
    """The engine's deadline leaves time to answer inside every allowed webhook timeout."""
    assert OperatorConfig(webhook_timeout=5).evaluation_deadline == 4.0
    assert OperatorConfig(webhook_timeout=30).evaluation_deadline == 29.0
    assert 0 < OperatorConfig(webhook_timeout=1).evaluation_deadline < 1


# --- AP_CERT_LIFETIME (issue 12: certificate rotation, seen happen in tests) ---------------------------------

def test_cert_lifetime_defaults_to_a_year_checked_hourly() -> None:
    settings = OperatorConfig.from_env({})
    assert settings.cert_lifetime == 365 * 86400
    assert settings.cert_check_interval == 3600.0
    assert settings.cert_switch_grace == 5.0


@pytest.mark.parametrize(("raw", "seconds"), [("30", 30), ("45s", 45), ("15m", 900), ("12h", 43200),
                                              ("90d", 90 * 86400), ("3650d", 3650 * 86400), (" 2H ", 7200)])
def test_cert_lifetime_takes_seconds_or_a_unit(raw: str, seconds: int) -> None:
    assert OperatorConfig.from_env({"AP_CERT_LIFETIME": raw}).cert_lifetime == seconds


@pytest.mark.parametrize("raw", ["29", "29s", "3651d", "0", "-60", "1.5h", "1w", "h", "30 days", "1e3"])
def test_cert_lifetime_out_of_range_or_malformed_names_the_variable(raw: str) -> None:
    with pytest.raises(ValueError, match=r"AP_CERT_LIFETIME=.*from 30s to 3650d"):
        OperatorConfig.from_env({"AP_CERT_LIFETIME": raw})


def test_a_short_cert_lifetime_is_checked_and_switched_well_inside_its_last_third() -> None:
    """Renewal is due with a third of the lifetime left: a check, the switch grace and the
    replicas' reload must all fit before the old certificate expires."""
    settings = OperatorConfig.from_env({"AP_CERT_LIFETIME": "30"})
    assert settings.cert_check_interval == 3.0
    assert settings.cert_switch_grace == 3.0
    assert settings.cert_check_interval + settings.cert_switch_grace < settings.cert_lifetime / 3


# --- the background audit (issue 14) ---------------------------------------------------------------------

def test_audit_settings_default_to_a_scan_every_five_minutes() -> None:
    settings = OperatorConfig.from_env({})
    assert (settings.audit_interval, settings.audit_page_size, settings.audit_violations_limit) == (300, 500, 20)


@pytest.mark.parametrize(("raw", "seconds"), [("0", 0), ("45", 45), ("30s", 30), ("5m", 300), ("1h", 3600)])
def test_audit_interval_takes_seconds_or_a_unit_and_0_disables(raw: str, seconds: int) -> None:
    assert OperatorConfig.from_env({"AP_AUDIT_INTERVAL": raw}).audit_interval == seconds


@pytest.mark.parametrize(("name", "raw"), [("AP_AUDIT_INTERVAL", "8d"), ("AP_AUDIT_INTERVAL", "soon"),
                                           ("AP_AUDIT_PAGE_SIZE", "0"), ("AP_AUDIT_VIOLATIONS_LIMIT", "501")])
def test_bad_audit_settings_name_the_variable(name: str, raw: str) -> None:
    with pytest.raises(ValueError, match=name):
        OperatorConfig.from_env({name: raw})


# --- one list of settings: from_env, `admission-policy run` and docs/configuration.md (issue 25) ------------

def test_docs_configuration_is_generated_from_the_settings() -> None:
    committed = (ROOT / "docs" / "configuration.md").read_text(encoding="utf-8")
    assert committed == markdown_table(), (
        "docs/configuration.md is out of date with operator/admission_policy/config.py; regenerate it:\n"
        "    python -m admission_policy.config > docs/configuration.md")


def test_the_docs_table_lists_every_setting_once_with_its_flag() -> None:
    rows = [line for line in markdown_table().splitlines() if line.startswith("| `AP_")]
    assert [row.split(" | ")[:2] for row in rows] == [[f"| `{s.env}`", f"`{s.flag}`"] for s in SETTINGS.values()]
    assert {"AP_FEATURE_GATES", "AP_POD_NAME", "AP_PEERING_NAME"} <= {s.env for s in SETTINGS.values()}
    assert len({s.env for s in SETTINGS.values()}) == len({s.flag for s in SETTINGS.values()}) == len(SETTINGS)


def test_a_default_written_as_a_value_is_the_default() -> None:
    """The docs say `365d` where the field holds 31536000: the two must not drift apart."""
    for name, setting in SETTINGS.items():
        shown = default_text(name)
        if shown.startswith("`"):
            value = setting.parse(shown.strip("`"), setting.env)
            assert value == getattr(OperatorConfig(), name), name


def test_every_setting_is_read_from_its_variable() -> None:
    """Each variable reaches its own field: a value that parses differs from the default."""
    given = {"AP_ADVERTISE_PORT": "8443", "AP_MAX_CONNECTIONS": "16", "AP_CERT_LIFETIME": "1d",
             "AP_FEATURE_GATES": "PythonPlugins=false", "AP_AUDIT_INTERVAL": "0", "AP_AUDIT_PAGE_SIZE": "50",
             "AP_AUDIT_VIOLATIONS_LIMIT": "0"}
    config = OperatorConfig.from_env(given)
    assert (config.advertise_port, config.max_connections, config.cert_lifetime, config.feature_gates,
            config.audit_interval, config.audit_page_size, config.audit_violations_limit) == (
        8443, 16, 86400, "PythonPlugins=false", 0, 50, 0)

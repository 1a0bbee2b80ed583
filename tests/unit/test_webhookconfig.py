"""Webhook configuration bodies: every field, determinism, expansion, exclusions, client configs."""

import base64
import copy
import dataclasses
from typing import Any

import pytest
from celcases import evaluate

from admission_policy.cluster.discovery import DiscoveredResource
from admission_policy.cluster.routing import (
    NEVER_ROUTED,
    RouteRule,
    break_glass_condition,
    never_judged,
    unserved_resources,
)
from admission_policy.config import OperatorConfig
from admission_policy.operator.webhookconfig import (
    RECORD_OR_SPEC_WRITTEN,
    SPEC_WRITTEN,
    build_mutating_configuration,
    build_validating_configuration,
    holds,
    probe_name,
)

CA = "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n"
CA_B64 = base64.b64encode(CA.encode()).decode()
SETTINGS = OperatorConfig(exempt_namespaces=("kube-system", "cert-manager"))
# The entries for the operator's own kinds, there whatever the policies route.
POLICIES = "policies.validate.policy-operator.dev"
TENANT_POLICIES = "tenant-policies.validate.policy-operator.dev"
VALIDATE_EXCEPTIONS = "exceptions.validate.policy-operator.dev"
MUTATE_EXCEPTIONS = "exceptions.mutate.policy-operator.dev"
PROBE = "probe.validate.policy-operator.dev"
FIXED = (POLICIES, TENANT_POLICIES, VALIDATE_EXCEPTIONS, MUTATE_EXCEPTIONS, PROBE)

DISCOVERED = (
    DiscoveredResource("", "v1", "pods", ("status", "exec", "log", "eviction")),
    DiscoveredResource("", "v1", "configmaps"),
    DiscoveredResource("", "v1", "events"),
    DiscoveredResource("", "v1", "namespaces", ("status", "finalize"), namespaced=False),
    DiscoveredResource("apps", "v1", "deployments", ("status", "scale")),
    DiscoveredResource("autoscaling", "v2", "horizontalpodautoscalers", ("status",)),
    DiscoveredResource("coordination.k8s.io", "v1", "leases"),
    DiscoveredResource("events.k8s.io", "v1", "events"),
    DiscoveredResource("authentication.k8s.io", "v1", "tokenreviews"),
    DiscoveredResource("authorization.k8s.io", "v1", "subjectaccessreviews"),
    DiscoveredResource("authorization.k8s.io", "v1", "selfsubjectaccessreviews", namespaced=False),
    DiscoveredResource("authorization.k8s.io", "v1", "localsubjectaccessreviews"),
    DiscoveredResource("authorization.k8s.io", "v1", "selfsubjectrulesreviews", namespaced=False),
    DiscoveredResource("admissionregistration.k8s.io", "v1", "validatingwebhookconfigurations"),
    DiscoveredResource("admissionregistration.k8s.io", "v1", "mutatingwebhookconfigurations"),
    DiscoveredResource("admissionregistration.k8s.io", "v1", "validatingadmissionpolicies", ("status",)),
    DiscoveredResource("admissionregistration.k8s.io", "v1", "validatingadmissionpolicybindings"),
    DiscoveredResource("policy-operator.dev", "v1alpha1", "admissionpolicies", ("status",), False),
    DiscoveredResource("policy-operator.dev", "v1alpha1", "namespacedadmissionpolicies", ("status",)),
    DiscoveredResource("policy-operator.dev", "v1alpha1", "admissionpolicyexceptions", ("status",)),
    DiscoveredResource("apiextensions.k8s.io", "v1", "customresourcedefinitions", ("status",), False),
    DiscoveredResource("kopf.dev", "v1", "clusterkopfpeerings", (), False),
)


def route(
    groups: tuple[str, ...] = ("",),
    resources: tuple[str, ...] = ("pods",),
    operations: tuple[str, ...] = ("CREATE",),
    versions: tuple[str, ...] = ("v1",),
    failure_policy: Any = "Fail",
    mutating: bool = False,
    namespace: str = "",
) -> RouteRule:
    return RouteRule(groups, versions, resources, operations, failure_policy, mutating, namespace)


def validating(*routes: RouteRule, settings: OperatorConfig = SETTINGS) -> dict[str, Any]:
    return build_validating_configuration(settings, CA, routes, DISCOVERED)


def mutating(*routes: RouteRule, settings: OperatorConfig = SETTINGS) -> dict[str, Any]:
    return build_mutating_configuration(settings, CA, routes, DISCOVERED)


def webhook(config: dict[str, Any], name: str) -> dict[str, Any]:
    found: list[dict[str, Any]] = [w for w in config["webhooks"] if w["name"] == name]
    assert len(found) == 1, [w["name"] for w in config["webhooks"]]
    return found[0]


def names(config: dict[str, Any]) -> list[str]:
    return [w["name"] for w in config["webhooks"]]


def routed(config: dict[str, Any]) -> list[dict[str, Any]]:
    return [w for w in config["webhooks"] if w["name"] not in FIXED]


def routed_pairs(config: dict[str, Any]) -> set[tuple[str, str]]:
    return {
        (group, resource.partition("/")[0])
        for w in routed(config)
        for rule in w["rules"]
        for group in rule["apiGroups"]
        for resource in rule["resources"]
    }


def test_validating_configuration_field_by_field() -> None:
    config = validating(route(operations=("CREATE", "UPDATE")))
    assert config["apiVersion"] == "admissionregistration.k8s.io/v1"
    assert config["kind"] == "ValidatingWebhookConfiguration"
    assert config["metadata"] == {
        "name": "admission-policy-operator",
        "labels": {"app.kubernetes.io/managed-by": "admission-policy-operator"},
    }
    assert names(config) == [
        "policies.validate.policy-operator.dev",
        "tenant-policies.validate.policy-operator.dev",
        "exceptions.validate.policy-operator.dev",
        "fail.validate.policy-operator.dev",
        "probe.validate.policy-operator.dev",
    ]
    assert webhook(config, "fail.validate.policy-operator.dev") == {
        "name": "fail.validate.policy-operator.dev",
        "admissionReviewVersions": ["v1"],
        "clientConfig": {
            "service": {
                "namespace": "admission-policy-system",
                "name": "admission-policy-operator",
                "port": 443,
                "path": "/validate",
            },
            "caBundle": CA_B64,
        },
        "failurePolicy": "Fail",
        "matchPolicy": "Equivalent",
        "namespaceSelector": {
            "matchExpressions": [
                {
                    "key": "kubernetes.io/metadata.name",
                    "operator": "NotIn",
                    "values": ["admission-policy-system", "cert-manager", "kube-system"],
                }
            ]
        },
        "matchConditions": [break_glass_condition((), ("system:masters",))],
        "rules": [
            {
                "apiGroups": [""],
                "apiVersions": ["v1"],
                "operations": ["CREATE", "UPDATE"],
                "resources": ["pods"],
                "scope": "*",
            }
        ],
        "sideEffects": "None",
        "timeoutSeconds": 5,
    }


def test_fixed_admission_policy_entry_is_always_there() -> None:
    config = validating()
    assert names(config) == [POLICIES, TENANT_POLICIES, VALIDATE_EXCEPTIONS, PROBE]
    assert config["webhooks"][:1] == [
        {
            "name": "policies.validate.policy-operator.dev",
            "admissionReviewVersions": ["v1"],
            "clientConfig": {
                "service": {
                    "namespace": "admission-policy-system",
                    "name": "admission-policy-operator",
                    "port": 443,
                    "path": "/validate-policy",
                },
                "caBundle": CA_B64,
            },
            "failurePolicy": "Fail",
            "matchPolicy": "Equivalent",
            # Only where a spec is written: finalizer removal and deletes never need the operator.
            "matchConditions": [{
                "name": "spec-written",
                "expression": "request.operation == 'CREATE' || (!has(object.metadata.deletionTimestamp)"
                              " && (has(object.spec) != has(oldObject.spec)"
                              " || (has(object.spec) && object.spec != oldObject.spec)))",
            }],
            "rules": [
                {
                    "apiGroups": ["policy-operator.dev"],
                    "apiVersions": ["v1alpha1"],
                    "operations": ["CREATE", "UPDATE"],
                    "resources": ["admissionpolicies"],
                    "scope": "*",
                }
            ],
            "sideEffects": "None",
            "timeoutSeconds": 5,
        }
    ]


def test_mutating_configuration() -> None:
    config = mutating(route(mutating=True), route(mutating=False, resources=("configmaps",)))
    assert config["kind"] == "MutatingWebhookConfiguration"
    exceptions, only = config["webhooks"]
    assert exceptions["name"] == "exceptions.mutate.policy-operator.dev"
    assert only["name"] == "fail.mutate.policy-operator.dev"
    assert only["reinvocationPolicy"] == "IfNeeded"
    assert only["clientConfig"]["service"]["path"] == "/mutate"
    assert only["rules"] == [
        {"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"], "resources": ["pods"], "scope": "*"}
    ]
    assert "reinvocationPolicy" not in webhook(validating(route()), "fail.validate.policy-operator.dev")


def test_no_mutating_policies_leaves_only_the_fixed_exception_entry() -> None:
    assert names(mutating(route())) == [MUTATE_EXCEPTIONS]
    assert names(mutating()) == [MUTATE_EXCEPTIONS]


# ---- issue 27: the fixed entries that review AdmissionPolicyExceptions ---------------------------------


def exception_entry(name: str, client_config: dict[str, Any]) -> dict[str, Any]:
    return {
        "name": name,
        "admissionReviewVersions": ["v1"],
        "clientConfig": client_config,
        "failurePolicy": "Fail",
        "matchPolicy": "Equivalent",
        # No namespaceSelector, no objectSelector: an exception in an exempt namespace, or labelled
        # exempt, is reviewed all the same (its record and approval are guarded everywhere).
        "matchConditions": [{"name": "record-or-spec-written", "expression": RECORD_OR_SPEC_WRITTEN}],
        "rules": [
            {
                "apiGroups": ["policy-operator.dev"],
                "apiVersions": ["v1alpha1"],
                "operations": ["CREATE", "UPDATE"],
                "resources": ["admissionpolicyexceptions"],
                "scope": "Namespaced",
            }
        ],
        "sideEffects": "None",
        "timeoutSeconds": 5,
    }


def service(path: str) -> dict[str, Any]:
    return {
        "service": {"namespace": "admission-policy-system", "name": "admission-policy-operator", "port": 443,
                    "path": path},
        "caBundle": CA_B64,
    }


@pytest.mark.parametrize("routes", [
    pytest.param((), id="no-policies"),
    pytest.param((route(),), id="validating-only"),
    pytest.param((route(mutating=True), route(groups=("*",), resources=("*",), failure_policy="Ignore",
                                              mutating=True)), id="mutating-wildcards"),
])
def test_fixed_exception_entries_are_always_there(routes: tuple[RouteRule, ...]) -> None:
    """Without the mutating entry no exception is recorded (created by, approved by), and without
    the validating one a record written by hand would stand: neither depends on the policies."""
    assert names(validating(*routes))[:3] == [POLICIES, TENANT_POLICIES, VALIDATE_EXCEPTIONS]
    assert names(mutating(*routes))[0] == MUTATE_EXCEPTIONS
    assert webhook(validating(*routes), VALIDATE_EXCEPTIONS) == exception_entry(
        VALIDATE_EXCEPTIONS, service("/validate-exception"))
    assert webhook(mutating(*routes), MUTATE_EXCEPTIONS) == exception_entry(
        MUTATE_EXCEPTIONS, service("/mutate-exception"))


EXCEPTION: dict[str, Any] = {
    "apiVersion": "policy-operator.dev/v1alpha1",
    "kind": "AdmissionPolicyException",
    "metadata": {"name": "legacy-app", "namespace": "team-a", "generation": 1,
                 "annotations": {"policy-operator.dev/created-by": "alice"}},
    "spec": {"policies": [{"name": "no-privileged-pods"}], "match": {"names": ["legacy"]}},
}


def changed(obj: dict[str, Any], **metadata: Any) -> dict[str, Any]:
    """A copy of ``obj`` with these metadata fields (None: removed)."""
    result = copy.deepcopy(obj)
    for key, value in metadata.items():
        if value is None:
            result["metadata"].pop(key, None)
        else:
            result["metadata"][key] = value
    return result


def with_spec(obj: dict[str, Any], spec: dict[str, Any]) -> dict[str, Any]:
    return {**copy.deepcopy(obj), "spec": spec}


DELETING = changed(EXCEPTION, deletionTimestamp="2025-01-01T00:00:00Z", finalizers=["policy-operator.dev/cleanup"])
APPROVED = {"policy-operator.dev/created-by": "alice", "policy-operator.dev/approve": "true"}


@pytest.mark.parametrize(("operation", "old", "new", "reviewed"), [
    pytest.param("CREATE", None, EXCEPTION, True, id="create"),
    pytest.param("UPDATE", EXCEPTION, copy.deepcopy(EXCEPTION), False, id="no-change"),
    pytest.param("UPDATE", EXCEPTION, {**EXCEPTION, "status": {"phase": "Active"}}, False, id="status-only"),
    pytest.param("UPDATE", EXCEPTION, changed(EXCEPTION, labels={"team": "a"}), False, id="labels-only"),
    pytest.param("UPDATE", EXCEPTION, changed(EXCEPTION, finalizers=["x"]), False, id="finalizers-only"),
    pytest.param("UPDATE", EXCEPTION, changed(EXCEPTION, annotations=APPROVED), True, id="annotation-changed"),
    pytest.param("UPDATE", changed(EXCEPTION, annotations=None), EXCEPTION, True, id="first-annotation"),
    pytest.param("UPDATE", EXCEPTION, changed(EXCEPTION, annotations=None), True, id="last-annotation-removed"),
    pytest.param("UPDATE", EXCEPTION, with_spec(EXCEPTION, {"policies": [{"name": "other"}]}), True,
                 id="spec-changed"),
    pytest.param("UPDATE", DELETING, changed(DELETING, annotations=APPROVED), False,
                 id="deleting-annotation-changed"),
    pytest.param("UPDATE", DELETING, changed(DELETING, finalizers=None), False, id="deleting-finalizer-removed"),
])
def test_exception_entries_see_only_writes_of_the_record_or_the_spec(
        operation: str, old: dict[str, Any] | None, new: dict[str, Any], reviewed: bool) -> None:
    """The API server evaluates the matchCondition: what it lets by never waits for the operator,
    so an exception can always be relabelled, and released and deleted while the operator is down."""
    bindings = {"request": {"operation": operation}, "object": new, "oldObject": old}
    assert evaluate(RECORD_OR_SPEC_WRITTEN, **bindings) is reviewed


def test_split_by_failure_policy() -> None:
    config = validating(
        route(resources=("pods",), failure_policy="Fail"),
        route(resources=("configmaps",), failure_policy="Ignore"),
    )
    assert [w["name"] for w in routed(config)] == [
        "fail.validate.policy-operator.dev",
        "ignore.validate.policy-operator.dev",
    ]
    assert webhook(config, "fail.validate.policy-operator.dev")["failurePolicy"] == "Fail"
    ignore = webhook(config, "ignore.validate.policy-operator.dev")
    assert ignore["failurePolicy"] == "Ignore"
    assert ignore["rules"][0]["resources"] == ["configmaps"]
    assert ignore["clientConfig"]["service"]["path"] == "/validate"


def test_ignore_webhook_skips_what_the_fail_webhook_already_sends() -> None:
    config = validating(
        route(operations=("CREATE",), failure_policy="Fail"),
        route(operations=("*",), failure_policy="Ignore"),
        route(resources=("configmaps",), failure_policy="Ignore"),
        route(resources=("configmaps",), operations=("*",), failure_policy="Fail"),
    )
    assert webhook(config, "ignore.validate.policy-operator.dev")["rules"] == [
        {
            "apiGroups": [""],
            "apiVersions": ["v1"],
            "operations": ["CONNECT", "DELETE", "UPDATE"],
            "resources": ["pods"],
            "scope": "*",
        }
    ]


def test_identical_rules_merge_and_operations_union() -> None:
    config = validating(
        route(resources=("pods",), operations=("CREATE",)),
        route(resources=("pods",), operations=("UPDATE", "CREATE")),
        route(resources=("configmaps",), operations=("UPDATE", "CREATE")),
        route(groups=("apps",), resources=("deployments",), operations=("DELETE", "CONNECT", "CREATE", "UPDATE")),
    )
    assert webhook(config, "fail.validate.policy-operator.dev")["rules"] == [
        {
            "apiGroups": [""],
            "apiVersions": ["v1"],
            "operations": ["CREATE", "UPDATE"],
            "resources": ["configmaps", "pods"],
            "scope": "*",
        },
        {"apiGroups": ["apps"], "apiVersions": ["v1"], "operations": ["*"], "resources": ["deployments"], "scope": "*"},
    ]


def test_same_input_in_another_order_gives_an_identical_body() -> None:
    routes = [
        route(resources=("pods", "configmaps"), operations=("UPDATE", "CREATE")),
        route(groups=("apps", ""), resources=("*",), failure_policy="Ignore"),
        route(groups=("*",), resources=("*/status",), operations=("UPDATE",)),
        route(resources=("pods/exec",), operations=("CONNECT",), mutating=True),
        route(resources=("configmaps", "pods/exec"), operations=("*",), namespace="team-b"),
        route(groups=("apps",), resources=("deployments",), failure_policy="Ignore", mutating=True, namespace="team-a"),
    ]
    reordered = [
        RouteRule(
            tuple(reversed(r.api_groups)),
            r.api_versions,
            tuple(reversed(r.resources)),
            tuple(reversed(r.operations)),
            r.failure_policy,
            r.mutating,
            r.namespace,
        )
        for r in reversed(routes)
    ]
    shuffled_discovery = tuple(reversed(DISCOVERED))
    for build in (build_validating_configuration, build_mutating_configuration):
        first = build(SETTINGS, CA, routes, DISCOVERED)
        second = build(SETTINGS, CA, reordered, shuffled_discovery)
        assert first == second
        assert repr(first) == repr(second)  # key order too: replicas write byte-identical objects


def test_wildcards_expand_from_discovery_without_never_routed_resources() -> None:
    config = validating(route(groups=("*",), resources=("*",), operations=("*",), versions=("*",)))
    pairs = routed_pairs(config)
    assert pairs == {
        ("", "pods"),
        ("", "configmaps"),
        ("", "namespaces"),
        ("apps", "deployments"),
        ("autoscaling", "horizontalpodautoscalers"),
        ("apiextensions.k8s.io", "customresourcedefinitions"),
    }
    assert not pairs & NEVER_ROUTED
    rules = webhook(config, "fail.validate.policy-operator.dev")["rules"]
    assert {rule["apiVersions"][0] for rule in rules if rule["apiGroups"] == ["autoscaling"]} == {"v2"}
    assert all("*" not in rule["resources"] and "*" not in rule["apiGroups"] for rule in rules)


def test_wildcard_subresources_expand_per_resource() -> None:
    config = validating(route(groups=("*",), resources=("*/status",), operations=("UPDATE",)))
    rules = webhook(config, "fail.validate.policy-operator.dev")["rules"]
    resources = {(rule["apiGroups"][0], r) for rule in rules for r in rule["resources"]}
    assert resources == {
        ("", "pods/status"),
        ("", "namespaces/status"),
        ("apps", "deployments/status"),
        ("autoscaling", "horizontalpodautoscalers/status"),
        ("apiextensions.k8s.io", "customresourcedefinitions/status"),
    }


def test_wildcard_in_one_group() -> None:
    config = validating(route(groups=("apps",), resources=("*", "*/*")))
    assert webhook(config, "fail.validate.policy-operator.dev")["rules"][0]["resources"] == [
        "deployments",
        "deployments/scale",
        "deployments/status",
    ]


def test_explicit_rule_gets_the_preferred_version() -> None:
    config = validating(
        route(groups=("autoscaling",), resources=("horizontalpodautoscalers",), versions=("v1",)),
        route(resources=("pods/exec",), operations=("CONNECT",), versions=("*",)),
    )
    rules = webhook(config, "fail.validate.policy-operator.dev")["rules"]
    assert [(r["apiGroups"], r["apiVersions"], r["resources"]) for r in rules] == [
        (["autoscaling"], ["v2"], ["horizontalpodautoscalers"]),
    ]
    rules = webhook(config, "fail.connect.validate.policy-operator.dev")["rules"]
    assert [(r["apiGroups"], r["apiVersions"], r["resources"]) for r in rules] == [([""], ["v1"], ["pods/exec"])]


def test_connect_gets_its_own_entry_without_the_break_glass() -> None:
    """A CONNECT's object is PodExecOptions (no labels): the break-glass could never hold for it."""
    config = validating(route(resources=("pods", "pods/exec", "pods/attach"), operations=("*",)))
    objects = webhook(config, "fail.validate.policy-operator.dev")
    connect = webhook(config, "fail.connect.validate.policy-operator.dev")
    assert "matchConditions" not in connect
    assert connect["namespaceSelector"] == objects["namespaceSelector"]
    assert connect["rules"] == [{"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CONNECT"],
                                 "resources": ["pods/attach", "pods/exec"], "scope": "*"}]
    assert [c["name"] for c in objects["matchConditions"]] == ["not-break-glass"]
    assert objects["rules"] == [
        {"apiGroups": [""], "apiVersions": ["v1"], "operations": ["*"], "resources": ["pods"], "scope": "*"},
        {"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE", "DELETE", "UPDATE"],
         "resources": ["pods/attach", "pods/exec"], "scope": "*"},
    ]


def test_explicit_undiscovered_rule_is_kept_as_written() -> None:
    config = validating(route(groups=("example.com",), resources=("widgets",), versions=("v1beta1",)))
    assert webhook(config, "fail.validate.policy-operator.dev")["rules"] == [
        {
            "apiGroups": ["example.com"],
            "apiVersions": ["v1beta1"],
            "operations": ["CREATE"],
            "resources": ["widgets"],
            "scope": "*",
        }
    ]


@pytest.mark.parametrize(("group", "resource"), sorted(NEVER_ROUTED))
def test_explicit_never_routed_resources_are_dropped(group: str, resource: str) -> None:
    validating_routes = route(groups=(group,), resources=(resource, f"{resource}/status"))
    mutating_routes = route(groups=(group,), resources=(resource, f"{resource}/status"), mutating=True)
    # Only the fixed entries remain (those for AdmissionPolicyExceptions name them on purpose).
    assert names(validating(validating_routes)) == [POLICIES, TENANT_POLICIES, VALIDATE_EXCEPTIONS, PROBE]
    assert names(mutating(mutating_routes)) == [MUTATE_EXCEPTIONS]


def test_the_probe_entry_routes_one_event_name_made_of_the_other_entries() -> None:
    """Native enforcement proves the API server routes by a configuration just written by a dry-run
    Event that only that configuration routes; replicas with the same routes write the same name."""
    one, other = validating(route()), validating(route(), route(resources=("configmaps",)))
    assert one == validating(route())
    name = probe_name(one)
    assert name.startswith("admission-policy-operator.probe.") and name != probe_name(other)
    assert webhook(one, PROBE) == {
        "name": PROBE,
        "admissionReviewVersions": ["v1"],
        "clientConfig": service("/probe"),
        "failurePolicy": "Ignore",
        "matchPolicy": "Equivalent",
        "namespaceSelector": {"matchExpressions": [
            {"key": "kubernetes.io/metadata.name", "operator": "In", "values": ["admission-policy-system"]}]},
        "matchConditions": [{"name": "probe", "expression": f"request.name == '{name}'"}],
        "rules": [{"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"], "resources": ["events"],
                   "scope": "Namespaced"}],
        "sideEffects": "None",
        "timeoutSeconds": 5,
    }


def test_url_client_config_for_local_development() -> None:
    settings = OperatorConfig(advertise_host="host.docker.internal", listen_port=9443)
    config = validating(route(), settings=settings)
    assert [w["clientConfig"] for w in config["webhooks"]] == [
        {"url": "https://host.docker.internal:9443/validate-policy", "caBundle": CA_B64},
        {"url": "https://host.docker.internal:9443/validate-tenant-policy", "caBundle": CA_B64},
        {"url": "https://host.docker.internal:9443/validate-exception", "caBundle": CA_B64},
        {"url": "https://host.docker.internal:9443/validate", "caBundle": CA_B64},
        {"url": "https://host.docker.internal:9443/probe", "caBundle": CA_B64},
    ]
    assert [w["clientConfig"] for w in mutating(route(mutating=True), settings=settings)["webhooks"]] == [
        {"url": "https://host.docker.internal:9443/mutate-exception", "caBundle": CA_B64},
        {"url": "https://host.docker.internal:9443/mutate", "caBundle": CA_B64},
    ]


def test_ipv6_url_host_is_bracketed() -> None:
    config = validating(settings=OperatorConfig(advertise_host="fd00::1"))
    assert config["webhooks"][0]["clientConfig"]["url"] == "https://[fd00::1]:9443/validate-policy"


def test_service_client_config_and_timeout_follow_settings() -> None:
    settings = OperatorConfig(namespace="ops", service_name="ap", service_port=8443, webhook_timeout=12)
    hook = webhook(validating(route(), settings=settings), "fail.validate.policy-operator.dev")
    assert hook["clientConfig"]["service"] == {"namespace": "ops", "name": "ap", "port": 8443, "path": "/validate"}
    assert hook["timeoutSeconds"] == 12
    assert hook["namespaceSelector"]["matchExpressions"][0]["values"] == ["kube-system", "ops"]
    for config, name, path in ((validating(settings=settings), VALIDATE_EXCEPTIONS, "/validate-exception"),
                               (mutating(settings=settings), MUTATE_EXCEPTIONS, "/mutate-exception")):
        fixed = webhook(config, name)
        assert fixed["clientConfig"]["service"] == {"namespace": "ops", "name": "ap", "port": 8443, "path": path}
        assert fixed["timeoutSeconds"] == 12


def test_unserved_resources() -> None:
    routes = [
        route(resources=("pods", "pods/exec", "pods/bogus", "widgets")),
        route(groups=("example.com",), resources=("*",)),
        route(groups=("*",), resources=("*/nothing",)),
        route(groups=("coordination.k8s.io",), resources=("leases",)),
        route(groups=("*",), resources=("*",)),
    ]
    assert unserved_resources(routes, DISCOVERED) == [
        "*.example.com (not served by the cluster)",
        "*/nothing.* (not served by the cluster)",
        "leases.coordination.k8s.io (never sent to admission webhooks)",
        "pods/bogus (not served by the cluster)",
        "widgets (not served by the cluster)",
    ]


# ---- issue 18: the operator's own API is never judged; drift is recognised ----------------------------


def test_the_operators_own_api_is_never_routed_even_when_named() -> None:
    config = validating(route(groups=("policy-operator.dev", "kopf.dev"), resources=("*",)),
                        route(groups=("policy-operator.dev",), resources=("admissionpolicies", "admissionpolicies/*",
                                                                          "namespacedadmissionpolicies",
                                                                          "admissionpolicyexceptions")),
                        route(groups=("kopf.dev",), resources=("clusterkopfpeerings", "kopfpeerings")))
    assert names(config) == [POLICIES, TENANT_POLICIES, VALIDATE_EXCEPTIONS, PROBE]
    named = route(groups=("policy-operator.dev",), resources=("admissionpolicies", "namespacedadmissionpolicies",
                                                              "admissionpolicyexceptions"))
    assert unserved_resources([named], DISCOVERED) == [
        "admissionpolicies.policy-operator.dev (never sent to admission webhooks)",
        "admissionpolicyexceptions.policy-operator.dev (never sent to admission webhooks)",
        "namespacedadmissionpolicies.policy-operator.dev (never sent to admission webhooks)"]


def test_webhooks_routing_crds_skip_the_operators_own_crds_by_name() -> None:
    config = validating(route(groups=("*",), resources=("*",), failure_policy="Ignore"), route())
    ignore = webhook(config, "ignore.validate.policy-operator.dev")
    assert ignore["matchConditions"][1:] == [{
        "name": "not-the-operators-own-crds",
        "expression": "!(request.resource.group == 'apiextensions.k8s.io' && request.resource.resource == "
                      "'customresourcedefinitions' && request.name in ['admissionpolicies.policy-operator.dev', "
                      "'namespacedadmissionpolicies.policy-operator.dev', "
                      "'admissionpolicyexceptions.policy-operator.dev', 'clusterkopfpeerings.kopf.dev', "
                      "'kopfpeerings.kopf.dev'])"}]
    assert [c["name"] for c in webhook(config, "fail.validate.policy-operator.dev")["matchConditions"]] == [
        "not-break-glass"]   # pods only


@pytest.mark.parametrize(("group", "resource", "namespace", "name", "judged"), [
    ("", "pods", "default", "web", True),
    ("", "pods", "kube-system", "web", False),
    ("", "secrets", SETTINGS.namespace, "tls", False),
    ("", "namespaces", SETTINGS.namespace, SETTINGS.namespace, False),
    ("", "namespaces", "", "cert-manager", False),
    ("", "namespaces", "", "team-a", True),
    ("policy-operator.dev", "admissionpolicies", "", "any", False),
    ("policy-operator.dev", "namespacedadmissionpolicies", "team-a", "any", False),
    ("policy-operator.dev", "admissionpolicyexceptions", "team-a", "any", False),
    ("kopf.dev", "clusterkopfpeerings", "", "any", False),
    ("coordination.k8s.io", "leases", "team-a", "any", False),
    ("apiextensions.k8s.io", "customresourcedefinitions", "", "admissionpolicies.policy-operator.dev", False),
    ("apiextensions.k8s.io", "customresourcedefinitions", "", "namespacedadmissionpolicies.policy-operator.dev",
     False),
    ("apiextensions.k8s.io", "customresourcedefinitions", "", "admissionpolicyexceptions.policy-operator.dev", False),
    ("apiextensions.k8s.io", "customresourcedefinitions", "", "widgets.acme.com", True),
])
def test_never_judged_mirrors_the_routing(group: str, resource: str, namespace: str, name: str, judged: bool) -> None:
    assert never_judged(SETTINGS, group, resource, namespace, name) is not judged


def test_a_configuration_edited_by_hand_no_longer_holds() -> None:
    desired = validating(route(), route(failure_policy="Ignore"))
    as_stored = copy.deepcopy(desired)
    # What the API server adds or fills in is not drift.
    as_stored["metadata"].update(resourceVersion="7", uid="u", labels={**desired["metadata"]["labels"], "x": "y"})
    for hook in as_stored["webhooks"]:
        hook.setdefault("namespaceSelector", {})
        hook.setdefault("objectSelector", {"matchExpressions": None, "matchLabels": None})   # a client model's
        hook["clientConfig"]["url"] = None

    def routed_entry(c: dict[str, Any]) -> dict[str, Any]:
        return webhook(c, "fail.validate.policy-operator.dev")

    routed_entry(as_stored)["reinvocationPolicy"] = "Never"
    assert holds(as_stored, desired)

    edits = [
        lambda c: routed_entry(c)["rules"].pop(),
        lambda c: routed_entry(c).update(failurePolicy="Ignore"),
        lambda c: c["webhooks"].append(copy.deepcopy(routed_entry(c))),
        lambda c: c["webhooks"][0].update(objectSelector={"matchLabels": {"a": "b"}}),
        lambda c: routed_entry(c).update(matchConditions=[{"name": "never", "expression": "false"}]),
        lambda c: webhook(c, VALIDATE_EXCEPTIONS).update(failurePolicy="Ignore"),
        lambda c: webhook(c, VALIDATE_EXCEPTIONS).update(objectSelector={"matchLabels": {"a": "b"}}),
        lambda c: c["webhooks"].remove(webhook(c, VALIDATE_EXCEPTIONS)),
        lambda c: c["metadata"]["labels"].clear(),
    ]
    for edit in edits:
        edited = copy.deepcopy(as_stored)
        edit(edited)
        assert not holds(edited, desired), edit


def test_a_mutating_configuration_without_the_exception_entry_no_longer_holds() -> None:
    """An operator upgraded from before exceptions finds the MutatingWebhookConfiguration it left
    empty (stored as ``webhooks: null``): it must write the fixed entry, or nothing is recorded."""
    desired = mutating()
    assert not holds({**desired, "webhooks": None}, desired)
    assert holds(copy.deepcopy(desired), desired)


# ---- issue 27: NamespacedAdmissionPolicies --------------------------------------------------------------


def test_fixed_tenant_policy_entry_is_always_there() -> None:
    """A tenant's policy is checked at apply (its CEL, its kinds, its namespace's limits) wherever
    it is written: no namespaceSelector, so one in an exempt namespace is refused, not let through."""
    for config in (validating(), validating(route(), route(namespace="team-a"))):
        assert webhook(config, TENANT_POLICIES) == {
            "name": TENANT_POLICIES,
            "admissionReviewVersions": ["v1"],
            "clientConfig": service("/validate-tenant-policy"),
            "failurePolicy": "Fail",
            "matchPolicy": "Equivalent",
            "matchConditions": [{"name": "spec-written", "expression": SPEC_WRITTEN}],
            "rules": [
                {
                    "apiGroups": ["policy-operator.dev"],
                    "apiVersions": ["v1alpha1"],
                    "operations": ["CREATE", "UPDATE"],
                    "resources": ["namespacedadmissionpolicies"],
                    "scope": "Namespaced",
                }
            ],
            "sideEffects": "None",
            "timeoutSeconds": 5,
        }


def only_in(namespace: str) -> dict[str, Any]:
    return {"matchExpressions": [{"key": "kubernetes.io/metadata.name", "operator": "In", "values": [namespace]}]}


def test_a_tenant_policys_routes_get_an_entry_of_its_own_namespace_only() -> None:
    """Its failurePolicy Fail makes its own namespace's requests fail while the operator is away,
    never another's: the cluster-wide entries do not route what only a tenant policy names."""
    config = validating(route(operations=("CREATE", "UPDATE"), namespace="team-a"))
    assert [w["name"] for w in routed(config)] == ["team-a.tenant.fail.validate.policy-operator.dev"]
    cluster_wide = webhook(validating(route(operations=("CREATE", "UPDATE"))), "fail.validate.policy-operator.dev")
    assert webhook(config, "team-a.tenant.fail.validate.policy-operator.dev") == {
        **cluster_wide,
        "name": "team-a.tenant.fail.validate.policy-operator.dev",
        "namespaceSelector": only_in("team-a"),
        "rules": [{**rule, "scope": "Namespaced"} for rule in cluster_wide["rules"]],
    }


def test_tenant_routes_never_widen_the_cluster_wide_entries() -> None:
    config = validating(route(), route(resources=("configmaps",), failure_policy="Ignore"),
                        route(groups=("apps",), resources=("deployments",), namespace="team-a"),
                        route(resources=("secrets",), failure_policy="Ignore", namespace="team-b"))
    assert [w["name"] for w in routed(config)] == [
        "fail.validate.policy-operator.dev",
        "ignore.validate.policy-operator.dev",
        "team-a.tenant.fail.validate.policy-operator.dev",
        "team-b.tenant.ignore.validate.policy-operator.dev",
    ]
    assert webhook(config, "fail.validate.policy-operator.dev")["rules"][0]["resources"] == ["pods"]
    assert webhook(config, "ignore.validate.policy-operator.dev")["rules"][0]["resources"] == ["configmaps"]
    team_a = webhook(config, "team-a.tenant.fail.validate.policy-operator.dev")
    assert team_a["namespaceSelector"] == only_in("team-a")
    assert [r["resources"] for r in team_a["rules"]] == [["deployments"]]
    team_b = webhook(config, "team-b.tenant.ignore.validate.policy-operator.dev")
    assert team_b["namespaceSelector"] == only_in("team-b") and team_b["failurePolicy"] == "Ignore"


@pytest.mark.parametrize("namespace", ["kube-system", "cert-manager", "admission-policy-system"])
def test_tenant_routes_in_an_exempt_namespace_get_no_entry(namespace: str) -> None:
    """The exemption holds whoever wrote the policy: the operator can always be repaired there."""
    config = validating(route(resources=("configmaps",), namespace=namespace), route(namespace="team-a"))
    assert [w["name"] for w in routed(config)] == ["team-a.tenant.fail.validate.policy-operator.dev"]
    assert names(mutating(route(mutating=True, namespace=namespace))) == [MUTATE_EXCEPTIONS]


def test_what_a_cluster_wide_entry_routes_is_not_routed_again_for_a_tenant() -> None:
    """The handler evaluates every policy that matches, whichever entry called it: a second call
    would only double the work."""
    config = validating(route(operations=("CREATE",)), route(resources=("configmaps",), failure_policy="Ignore"),
                        route(operations=("CREATE", "UPDATE"), namespace="team-a"),
                        route(operations=("CREATE",), namespace="team-b"),
                        route(resources=("configmaps",), failure_policy="Ignore", namespace="team-b"),
                        route(resources=("pods", "configmaps"), operations=("DELETE",), failure_policy="Ignore",
                              namespace="team-a"),
                        route(resources=("pods",), operations=("DELETE",), namespace="team-a"))
    assert [w["name"] for w in routed(config)] == [
        "fail.validate.policy-operator.dev",
        "ignore.validate.policy-operator.dev",
        "team-a.tenant.fail.validate.policy-operator.dev",
        "team-a.tenant.ignore.validate.policy-operator.dev",
    ]
    assert webhook(config, "team-a.tenant.fail.validate.policy-operator.dev")["rules"] == [
        {"apiGroups": [""], "apiVersions": ["v1"], "operations": ["DELETE", "UPDATE"], "resources": ["pods"],
         "scope": "Namespaced"}]
    assert webhook(config, "team-a.tenant.ignore.validate.policy-operator.dev")["rules"] == [
        {"apiGroups": [""], "apiVersions": ["v1"], "operations": ["DELETE"], "resources": ["configmaps"],
         "scope": "Namespaced"}]


def test_a_tenants_fail_is_kept_where_the_cluster_wide_entry_ignores() -> None:
    """A tenant that chose failurePolicy Fail keeps it in its namespace: the Ignore entry's call
    may be skipped while the operator is away, the tenant's may not."""
    config = validating(route(failure_policy="Ignore"), route(namespace="team-a"))
    assert [w["name"] for w in routed(config)] == [
        "ignore.validate.policy-operator.dev", "team-a.tenant.fail.validate.policy-operator.dev"]


def test_tenant_connect_and_mutating_entries() -> None:
    config = validating(route(resources=("pods/exec",), operations=("CONNECT",), namespace="team-a"))
    connect = webhook(config, "team-a.tenant.fail.connect.validate.policy-operator.dev")
    assert connect["namespaceSelector"] == only_in("team-a") and "objectSelector" not in connect
    config = mutating(route(mutating=True, namespace="team-a"))
    (entry,) = routed(config)
    assert entry["name"] == "team-a.tenant.fail.mutate.policy-operator.dev"
    assert entry["clientConfig"]["service"]["path"] == "/mutate" and entry["reinvocationPolicy"] == "IfNeeded"
    assert entry["namespaceSelector"] == only_in("team-a")


def test_a_tenant_entry_never_routes_cluster_scoped_requests() -> None:
    """A namespaceSelector does not hold back a cluster-scoped object (other than a Namespace, judged
    by its own labels): a tenant's wildcard rules, routed with scope "*", would send every CRD
    written in the cluster to its Fail entry, so the tenant's policy could block the whole
    cluster's CRD writes while the operator is away; and its own Namespace, which the engine never
    lets a tenant judge."""
    cluster_scoped = {(d.group, d.resource) for d in DISCOVERED if not d.namespaced}
    for config in (validating(route(groups=("*",), resources=("*",), operations=("*",), namespace="team-a")),
                   validating(route(resources=("namespaces",), namespace="team-a")),
                   mutating(route(groups=("*",), resources=("*",), mutating=True, namespace="team-a"))):
        for entry in routed(config):
            for rule in entry["rules"]:
                named = {(group, resource.partition("/")[0]) for group in rule["apiGroups"]
                         for resource in rule["resources"]}
                assert rule["scope"] == "Namespaced" or not named & cluster_scoped, (entry["name"], rule)


def _skipped(condition: dict[str, str], *, user: str = "jane", groups: list[str] | None = None,
             labels: dict[str, str] | None = None, old_labels: dict[str, str] | None = None,
             operation: str = "CREATE") -> bool:
    """Whether the API server would hold the request back from the webhook (the condition false)."""
    def obj(found: dict[str, str] | None) -> dict[str, Any] | None:
        return None if found is None else {"metadata": {"name": "x", "labels": found} if found else {"name": "x"}}
    info: dict[str, Any] = {"username": user}
    if groups is not None:
        info["groups"] = groups
    request = {"operation": operation, "userInfo": info}
    return evaluate(condition["expression"], request=request, oldObject=obj(old_labels),
                    object=obj(labels) if operation != "DELETE" else None) is False


LABEL = {"policy-operator.dev/exempt": "true"}


@pytest.mark.parametrize(("kwargs", "skipped"), [
    ({"groups": ["system:masters", "system:authenticated"], "labels": LABEL}, True),
    ({"user": "system:serviceaccount:ops:operator", "groups": ["system:serviceaccounts"], "labels": LABEL}, True),
    # Anyone else: the label is theirs to set, so it changes nothing.
    ({"groups": ["system:authenticated"], "labels": LABEL}, False),
    ({"user": "system:serviceaccount:ops:other", "labels": LABEL}, False),
    ({"labels": LABEL}, False),   # no groups at all
    # A named identity without the label is judged like anyone.
    ({"groups": ["system:masters"], "labels": {}}, False),
    ({"groups": ["system:masters"], "labels": {"policy-operator.dev/exempt": "yes"}}, False),
    ({"groups": ["system:masters"]}, False),   # an object without labels
    # UPDATE judges the new object: removing the label puts the object back under the policies.
    ({"groups": ["system:masters"], "labels": {}, "old_labels": LABEL, "operation": "UPDATE"}, False),
    ({"groups": ["system:masters"], "labels": LABEL, "old_labels": {}, "operation": "UPDATE"}, True),
    # DELETE has no object: the stored one decides.
    ({"groups": ["system:masters"], "old_labels": LABEL, "operation": "DELETE"}, True),
    ({"groups": ["system:authenticated"], "old_labels": LABEL, "operation": "DELETE"}, False),
    ({"groups": ["system:masters"], "old_labels": {}, "operation": "DELETE"}, False),
])
def test_break_glass_holds_only_for_named_identities_writing_a_labelled_object(
        kwargs: dict[str, Any], skipped: bool) -> None:
    condition = break_glass_condition(("system:serviceaccount:ops:operator",), ("system:masters",))
    assert condition is not None
    assert _skipped(condition, **kwargs) is skipped


def test_break_glass_names_are_quoted_as_cel_strings() -> None:
    odd = 'o\'dd "group"'
    condition = break_glass_condition(('a"b\\c',), (odd,))
    assert condition is not None
    assert _skipped(condition, user='a"b\\c', labels=LABEL)
    assert _skipped(condition, user="x", groups=[odd], labels=LABEL)
    assert not _skipped(condition, user="x", groups=["o"], labels=LABEL)


def test_break_glass_naming_nobody_gives_no_condition() -> None:
    settings = OperatorConfig(exempt_namespaces=(), break_glass_groups=(), break_glass_users=())
    assert break_glass_condition((), ()) is None
    assert "matchConditions" not in webhook(validating(route(), settings=settings), "fail.validate.policy-operator.dev")


def test_the_operators_own_kinds_have_no_break_glass() -> None:
    """Nothing may smuggle in a policy that does not compile, nor an approval."""
    settings = dataclasses.replace(SETTINGS, break_glass_users=("admin",))
    for config in (validating(route(), settings=settings), mutating(route(mutating=True), settings=settings)):
        for entry in config["webhooks"]:
            if entry["name"] in FIXED:
                assert "objectSelector" not in entry, entry["name"]
                assert "not-break-glass" not in [c["name"] for c in entry["matchConditions"]], entry["name"]
            else:
                assert entry["matchConditions"][0]["name"] == "not-break-glass", entry["name"]
                assert "objectSelector" not in entry

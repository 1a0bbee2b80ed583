"""Webhook configuration bodies: every field, determinism, expansion, exclusions, client configs."""

import base64
import copy
from typing import Any

import pytest

from admission_policy.cluster.discovery import DiscoveredResource
from admission_policy.cluster.routing import NEVER_ROUTED, RouteRule, never_judged, unserved_resources
from admission_policy.operator.config import OperatorConfig
from admission_policy.operator.webhookconfig import (
    build_mutating_configuration,
    build_validating_configuration,
    holds,
)

CA = "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n"
CA_B64 = base64.b64encode(CA.encode()).decode()
SETTINGS = OperatorConfig(exempt_namespaces=("kube-system", "cert-manager"))

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
) -> RouteRule:
    return RouteRule(groups, versions, resources, operations, failure_policy, mutating)


def validating(*routes: RouteRule, settings: OperatorConfig = SETTINGS) -> dict[str, Any]:
    return build_validating_configuration(settings, CA, routes, DISCOVERED)


def mutating(*routes: RouteRule, settings: OperatorConfig = SETTINGS) -> dict[str, Any]:
    return build_mutating_configuration(settings, CA, routes, DISCOVERED)


def webhook(config: dict[str, Any], name: str) -> dict[str, Any]:
    found: list[dict[str, Any]] = [w for w in config["webhooks"] if w["name"] == name]
    assert len(found) == 1, [w["name"] for w in config["webhooks"]]
    return found[0]


def routed_pairs(config: dict[str, Any]) -> set[tuple[str, str]]:
    return {
        (group, resource.partition("/")[0])
        for w in config["webhooks"]
        if w["name"] != "policies.validate.policy-operator.dev"
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
    assert [w["name"] for w in config["webhooks"]] == [
        "policies.validate.policy-operator.dev",
        "fail.validate.policy-operator.dev",
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
        "objectSelector": {
            "matchExpressions": [{"key": "policy-operator.dev/exempt", "operator": "NotIn", "values": ["true"]}]
        },
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
    assert config["webhooks"] == [
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
    (only,) = config["webhooks"]
    assert only["name"] == "fail.mutate.policy-operator.dev"
    assert only["reinvocationPolicy"] == "IfNeeded"
    assert only["clientConfig"]["service"]["path"] == "/mutate"
    assert only["rules"] == [
        {"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"], "resources": ["pods"], "scope": "*"}
    ]
    assert "reinvocationPolicy" not in webhook(validating(route()), "fail.validate.policy-operator.dev")


def test_no_mutating_policies_means_no_mutating_webhooks() -> None:
    assert mutating(route())["webhooks"] == []


def test_split_by_failure_policy() -> None:
    config = validating(
        route(resources=("pods",), failure_policy="Fail"),
        route(resources=("configmaps",), failure_policy="Ignore"),
    )
    assert [w["name"] for w in config["webhooks"]][1:] == [
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
    ]
    reordered = [
        RouteRule(
            tuple(reversed(r.api_groups)),
            r.api_versions,
            tuple(reversed(r.resources)),
            tuple(reversed(r.operations)),
            r.failure_policy,
            r.mutating,
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


def test_connect_gets_its_own_entry_without_an_object_selector() -> None:
    """A CONNECT's object is PodExecOptions (no labels): the API server would never match the
    exemption's objectSelector, and the webhook would never be called."""
    config = validating(route(resources=("pods", "pods/exec", "pods/attach"), operations=("*",)))
    objects = webhook(config, "fail.validate.policy-operator.dev")
    connect = webhook(config, "fail.connect.validate.policy-operator.dev")
    assert "objectSelector" not in connect
    assert connect["namespaceSelector"] == objects["namespaceSelector"]
    assert connect["rules"] == [{"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CONNECT"],
                                 "resources": ["pods/attach", "pods/exec"], "scope": "*"}]
    assert objects["objectSelector"]["matchExpressions"][0]["key"] == "policy-operator.dev/exempt"
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
    config = validating(route(groups=(group,), resources=(resource, f"{resource}/status")))
    assert [w["name"] for w in config["webhooks"]] == ["policies.validate.policy-operator.dev"]


def test_url_client_config_for_local_development() -> None:
    settings = OperatorConfig(advertise_host="host.docker.internal", listen_port=9443)
    config = validating(route(), settings=settings)
    assert [w["clientConfig"] for w in config["webhooks"]] == [
        {"url": "https://host.docker.internal:9443/validate-policy", "caBundle": CA_B64},
        {"url": "https://host.docker.internal:9443/validate", "caBundle": CA_B64},
    ]
    assert mutating(route(mutating=True), settings=settings)["webhooks"][0]["clientConfig"] == {
        "url": "https://host.docker.internal:9443/mutate",
        "caBundle": CA_B64,
    }


def test_ipv6_url_host_is_bracketed() -> None:
    config = validating(settings=OperatorConfig(advertise_host="fd00::1"))
    assert config["webhooks"][0]["clientConfig"]["url"] == "https://[fd00::1]:9443/validate-policy"


def test_service_client_config_and_timeout_follow_settings() -> None:
    settings = OperatorConfig(namespace="ops", service_name="ap", service_port=8443, webhook_timeout=12)
    hook = webhook(validating(route(), settings=settings), "fail.validate.policy-operator.dev")
    assert hook["clientConfig"]["service"] == {"namespace": "ops", "name": "ap", "port": 8443, "path": "/validate"}
    assert hook["timeoutSeconds"] == 12
    assert hook["namespaceSelector"]["matchExpressions"][0]["values"] == ["kube-system", "ops"]


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
                        route(groups=("policy-operator.dev",), resources=("admissionpolicies", "admissionpolicies/*")),
                        route(groups=("kopf.dev",), resources=("clusterkopfpeerings", "kopfpeerings")))
    assert [w["name"] for w in config["webhooks"]] == ["policies.validate.policy-operator.dev"]
    named = route(groups=("policy-operator.dev",), resources=("admissionpolicies",))
    assert unserved_resources([named], DISCOVERED) == [
        "admissionpolicies.policy-operator.dev (never sent to admission webhooks)"]


def test_webhooks_routing_crds_skip_the_operators_own_crds_by_name() -> None:
    config = validating(route(groups=("*",), resources=("*",), failure_policy="Ignore"), route())
    ignore = webhook(config, "ignore.validate.policy-operator.dev")
    assert ignore["matchConditions"] == [{
        "name": "not-the-operators-own-crds",
        "expression": "!(request.resource.group == 'apiextensions.k8s.io' && request.resource.resource == "
                      "'customresourcedefinitions' && request.name in ['admissionpolicies.policy-operator.dev', "
                      "'clusterkopfpeerings.kopf.dev', 'kopfpeerings.kopf.dev'])"}]
    assert "matchConditions" not in webhook(config, "fail.validate.policy-operator.dev")   # pods only


@pytest.mark.parametrize(("group", "resource", "namespace", "name", "judged"), [
    ("", "pods", "default", "web", True),
    ("", "pods", "kube-system", "web", False),
    ("", "secrets", SETTINGS.namespace, "tls", False),
    ("", "namespaces", SETTINGS.namespace, SETTINGS.namespace, False),
    ("", "namespaces", "", "cert-manager", False),
    ("", "namespaces", "", "team-a", True),
    ("policy-operator.dev", "admissionpolicies", "", "any", False),
    ("kopf.dev", "clusterkopfpeerings", "", "any", False),
    ("coordination.k8s.io", "leases", "team-a", "any", False),
    ("apiextensions.k8s.io", "customresourcedefinitions", "", "admissionpolicies.policy-operator.dev", False),
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
    as_stored["webhooks"][1]["reinvocationPolicy"] = "Never"
    assert holds(as_stored, desired)

    edits = [
        lambda c: c["webhooks"][1]["rules"].pop(),
        lambda c: c["webhooks"][1].update(failurePolicy="Ignore"),
        lambda c: c["webhooks"].append(copy.deepcopy(c["webhooks"][1])),
        lambda c: c["webhooks"][0].update(objectSelector={"matchLabels": {"a": "b"}}),
        lambda c: c["webhooks"][1].update(matchConditions=[{"name": "never", "expression": "false"}]),
        lambda c: c["metadata"]["labels"].clear(),
    ]
    for edit in edits:
        edited = copy.deepcopy(as_stored)
        edit(edited)
        assert not holds(edited, desired), edit

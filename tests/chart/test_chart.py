"""The Helm chart, linted and rendered by the real Helm v4 engine (helm-python-sdk, no binary,
no network), every manifest schema-checked with kubernetes-validate."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

import helm_python as helm
import jsonschema
import kubernetes_validate
import pytest
import yaml
from chart_render import CHART_DIR, NAMESPACE, RELEASE, ROOT, SCENARIOS, crd_documents, render

from admission_policy import features
from admission_policy.cluster.routing import BREAK_GLASS_LABEL
from admission_policy.config import SETTINGS, OperatorConfig

ROOT_CRDS = ROOT / "crds"
# Kopf's peering CRD is the chart's own: the repository's crds/ holds only the project's.
CHART_ONLY_CRDS = {"kopfpeering.yaml"}

# The Kubernetes versions the chart is validated against: the oldest it claims (Chart.yaml
# kubeVersion) and the newest kubernetes-validate ships.
KUBE_VERSIONS = ["1.28.0", kubernetes_validate.latest_version()]


# --------------------------------------------------------------------------------------------
# helpers


@pytest.fixture(scope="module")
def chart() -> Iterator[helm.Chart]:
    with helm.Chart.load(CHART_DIR) as loaded:
        yield loaded


def one(docs: list[dict], kind: str, component: str | None = None) -> dict:
    found = [d for d in docs if d["kind"] == kind and (component is None or component_of(d) == component)]
    assert len(found) == 1, f"expected one {kind} ({component}), found {[d['metadata']['name'] for d in found]}"
    return found[0]


def all_of(docs: list[dict], kind: str) -> list[dict]:
    return [d for d in docs if d["kind"] == kind]


def operator_deployment(docs: list[dict]) -> dict:
    return one(docs, "Deployment")


def operator_container(docs: list[dict]) -> dict:
    containers = operator_deployment(docs)["spec"]["template"]["spec"]["containers"]
    assert [c["name"] for c in containers] == ["operator"]
    return containers[0]


def env_of(container: dict) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container.get("env", [])}


def component_of(doc: dict) -> str | None:
    return doc["metadata"].get("labels", {}).get("app.kubernetes.io/component")


def pod_labels(docs: list[dict]) -> dict[str, str]:
    return operator_deployment(docs)["spec"]["template"]["metadata"]["labels"]


def operator_cluster_role(docs: list[dict]) -> dict:
    (role,) = [d for d in all_of(docs, "ClusterRole")
               if component_of(d) is None and not d["metadata"]["name"].endswith(EXCEPTION_ROLES + TENANT_ROLES)]
    return role


# The ClusterRoles for people, not for the operator: exception-roles.yaml, tenant-roles.yaml.
EXCEPTION_ROLES = ("-exception-editor", "-exception-approver")
TENANT_ROLES = ("-tenant-policy-editor", "-tenant-policy-viewer")


def cluster_role_ending(docs: list[dict], suffix: str) -> dict:
    (role,) = [d for d in all_of(docs, "ClusterRole") if d["metadata"]["name"].endswith(suffix)]
    return role


def webhook_service(docs: list[dict]) -> dict:
    return one(docs, "Service", "webhook")


def labels_match(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return all(labels.get(k) == v for k, v in selector.items())


# --------------------------------------------------------------------------------------------
# lint and render


def test_lint_default_values_is_clean() -> None:
    report = helm.lint(CHART_DIR, strict=True, namespace=NAMESPACE)
    assert report["errors"] == []
    assert [m for m in report["messages"] if m["severity"] >= 2] == []


@pytest.mark.parametrize("scenario", list(SCENARIOS))
@pytest.mark.parametrize("kube_version", ["v1.28.0", "v1.33.0"])
def test_lint_scenarios(scenario: str, kube_version: str) -> None:
    values, namespace = SCENARIOS[scenario]
    report = helm.lint(CHART_DIR, values, strict=True, namespace=namespace, kube_version=kube_version)
    assert report["errors"] == []
    assert [m for m in report["messages"] if m["severity"] >= 2] == []


def test_chart_claims_the_kubernetes_versions_it_is_validated_against(chart: helm.Chart) -> None:
    assert chart.metadata["kubeVersion"] == ">=1.28.0-0"
    assert chart.metadata["apiVersion"] == "v2"


@pytest.mark.parametrize("scenario", list(SCENARIOS))
def test_every_manifest_passes_kubernetes_schema(chart: helm.Chart, scenario: str) -> None:
    values, namespace = SCENARIOS[scenario]
    docs = render(chart, values, namespace)
    crds = crd_documents(chart)
    served = {
        (f"{crd['spec']['group']}/{version['name']}", crd["spec"]["names"]["kind"]): version
        for crd in crds.values()
        for version in crd["spec"]["versions"]
    }
    checked = 0
    for doc in docs:
        key = (doc["apiVersion"], doc["kind"])
        if key in served:
            # A custom resource: kubernetes-validate has no schema for it, the chart's CRD has.
            jsonschema.validate(doc, served[key]["schema"]["openAPIV3Schema"])
            checked += 1
            continue
        for version in KUBE_VERSIONS:
            kubernetes_validate.validate(doc, version, strict=True)
        checked += 1
    assert checked == len(docs) > 0


def test_crds_pass_kubernetes_schema(chart: helm.Chart) -> None:
    crds = crd_documents(chart)
    assert set(crds) == {"admissionpolicies.policy-operator.dev", "admissionpolicyexceptions.policy-operator.dev",
                         "namespacedadmissionpolicies.policy-operator.dev", "clusterkopfpeerings.kopf.dev"}
    for crd in crds.values():
        for version in KUBE_VERSIONS:
            kubernetes_validate.validate(crd, version, strict=True)


def test_chart_crds_are_copies_of_the_single_source() -> None:
    sources = {path.name for path in ROOT_CRDS.glob("*.yaml")}
    assert {"admissionpolicy.yaml", "admissionpolicyexception.yaml", "namespacedadmissionpolicy.yaml"} <= sources
    assert {path.name for path in (CHART_DIR / "crds").glob("*.yaml")} == sources | CHART_ONLY_CRDS
    for name in sorted(sources):
        assert (CHART_DIR / "crds" / name).read_bytes() == (ROOT_CRDS / name).read_bytes(), (
            f"charts/admission-policy-operator/crds/{name} differs from crds/{name}; "
            f"run: cp crds/{name} charts/admission-policy-operator/crds/"
        )


def test_kopf_peering_crd_and_object(chart: helm.Chart) -> None:
    crd = crd_documents(chart)["clusterkopfpeerings.kopf.dev"]
    assert crd["spec"]["group"] == "kopf.dev"
    assert crd["spec"]["scope"] == "Cluster"
    assert crd["spec"]["names"]["plural"] == "clusterkopfpeerings"
    assert crd["spec"]["names"]["kind"] == "ClusterKopfPeering"
    (version,) = crd["spec"]["versions"]
    assert version["name"] == "v1" and version["served"] and version["storage"]
    status = version["schema"]["openAPIV3Schema"]["properties"]["status"]
    assert status["x-kubernetes-preserve-unknown-fields"] is True

    docs = render(chart)
    peering = one(docs, "ClusterKopfPeering")
    assert peering["apiVersion"] == "kopf.dev/v1"
    assert "namespace" not in peering["metadata"]
    assert peering["metadata"]["name"] == env_of(operator_container(docs))["AP_PEERING_NAME"]


# --------------------------------------------------------------------------------------------
# RBAC


def rules_of(role: dict) -> set[tuple[str, str, str, str | None]]:
    flat = set()
    for rule in role["rules"]:
        for group in rule["apiGroups"]:
            for resource in rule["resources"]:
                for verb in rule["verbs"]:
                    for name in rule.get("resourceNames") or [None]:
                        flat.add((group, resource, verb, name))
    return flat


@pytest.mark.parametrize("scenario", list(SCENARIOS))
def test_no_rbac_wildcards(chart: helm.Chart, scenario: str) -> None:
    values, namespace = SCENARIOS[scenario]
    roles = [d for d in render(chart, values, namespace) if d["kind"] in ("Role", "ClusterRole")]
    # The operator's ClusterRole, its Roles in the release namespace and in "default" (events), the
    # cleanup hook's ClusterRole, the exception editor's and approver's ClusterRoles, the tenant
    # policy editor's and viewer's.
    assert len(roles) == 8
    for role in roles:
        for rule in role["rules"]:
            assert "nonResourceURLs" not in rule
            for field in ("apiGroups", "resources", "verbs", "resourceNames"):
                assert not any("*" in item for item in rule.get(field, [])), (role["metadata"]["name"], rule)


def test_operator_cluster_role_is_exactly_what_the_operator_uses(chart: helm.Chart) -> None:
    docs = render(chart)
    env = env_of(operator_container(docs))
    config, peering = env["AP_WEBHOOK_CONFIG_NAME"], env["AP_PEERING_NAME"]
    role = operator_cluster_role(docs)
    expected = set()

    def allow(group: str, resource: str, verbs: str, name: str | None = None) -> None:
        expected.update((group, resource, verb, name) for verb in verbs.split())

    # What the operator and Kopf call (tests/e2e/test_e2e_chart.py runs the operator with these roles).
    allow("policy-operator.dev", "admissionpolicies", "list watch patch")
    allow("policy-operator.dev", "admissionpolicies/status", "patch")
    # Tenant policies: the same lifecycle, in every namespace.
    allow("policy-operator.dev", "namespacedadmissionpolicies", "list watch patch")
    allow("policy-operator.dev", "namespacedadmissionpolicies/status", "patch")
    # Exceptions: watched, never patched (no finalizer); their status written; events in their namespace.
    allow("policy-operator.dev", "admissionpolicyexceptions", "list watch")
    allow("policy-operator.dev", "admissionpolicyexceptions/status", "patch")
    allow("", "events", "create")
    allow("apiextensions.k8s.io", "customresourcedefinitions", "get list watch")
    allow("", "namespaces", "get list watch")
    for kind in ("validatingwebhookconfigurations", "mutatingwebhookconfigurations"):
        allow("admissionregistration.k8s.io", kind, "create")
        allow("admissionregistration.k8s.io", kind, "get list watch update", config)
    # Native enforcement (operator/native.py): the generated Validating- and MutatingAdmissionPolicies
    # and bindings.
    for kind in ("validatingadmissionpolicies", "validatingadmissionpolicybindings",
                 "mutatingadmissionpolicies", "mutatingadmissionpolicybindings"):
        allow("admissionregistration.k8s.io", kind, "get list create update patch delete")
    allow("kopf.dev", "clusterkopfpeerings", "list watch")
    allow("kopf.dev", "clusterkopfpeerings", "patch", peering)
    # Policies' authorizer checks: a SubjectAccessReview each (operator/authorizer.py).
    allow("authorization.k8s.io", "subjectaccessreviews", "create")
    # The background audit: list what policies match (audit.listResources), write its reports.
    for group, resources in AUDIT_LISTED.items():
        for resource in resources.split():
            allow(group, resource, "list")
    allow("openreports.io", "reports", "list create patch delete")
    allow("openreports.io", "clusterreports", "list create patch delete")
    assert rules_of(role) == expected

    binding = next(d for d in all_of(docs, "ClusterRoleBinding") if d["roleRef"]["name"] == role["metadata"]["name"])
    sa = operator_deployment(docs)["spec"]["template"]["spec"]["serviceAccountName"]
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": sa, "namespace": NAMESPACE}]


AUDIT_LISTED = {
    "": "pods services configmaps serviceaccounts persistentvolumeclaims persistentvolumes replicationcontrollers "
        "nodes",
    "apps": "deployments replicasets statefulsets daemonsets",
    "batch": "jobs cronjobs",
    "networking.k8s.io": "ingresses networkpolicies",
    "rbac.authorization.k8s.io": "roles rolebindings clusterroles clusterrolebindings",
}


def test_audit_settings_reach_the_operator_and_a_disabled_audit_gets_no_rbac(chart: helm.Chart) -> None:
    env = env_of(operator_container(render(chart)))
    audit = (env["AP_AUDIT_INTERVAL"], env["AP_AUDIT_PAGE_SIZE"], env["AP_AUDIT_VIOLATIONS_LIMIT"])
    assert audit == ("5m", "500", "20")
    docs = render(chart, {"audit": {"interval": 0, "pageSize": 100, "violationsLimit": 5}})
    assert env_of(operator_container(docs))["AP_AUDIT_INTERVAL"] == "0"
    groups = {group for group, *_ in rules_of(operator_cluster_role(docs))}
    assert not groups & {"apps", "batch", "openreports.io"}, groups
    role, _ = role_in(docs, NAMESPACE)   # the release namespace: no admission-results ConfigMaps either
    assert {resource for _, resource, *_ in rules_of(role)} == {"secrets"}


def test_report_crds_are_installed_only_when_asked_and_outlive_the_release(chart: helm.Chart) -> None:
    """Uninstalling must not delete the Report CRDs: every tool's reports would go with them."""
    def crds(values: dict) -> list[dict]:
        return sorted((d for d in render(chart, values) if d["kind"] == "CustomResourceDefinition"),
                      key=lambda d: d["metadata"]["name"])
    assert crds({}) == []
    installed = crds({"reports": {"installCRDs": True}})
    assert [d["metadata"]["name"] for d in installed] == ["clusterreports.openreports.io", "reports.openreports.io"]
    assert [d["metadata"]["annotations"]["helm.sh/resource-policy"] for d in installed] == ["keep", "keep"]


def test_extra_rules_are_appended(chart: helm.Chart) -> None:
    values, namespace = SCENARIOS["everything"]
    docs = render(chart, values, namespace)
    role = operator_cluster_role(docs)
    assert ("", "configmaps", "get", None) in rules_of(role)


def test_context_resources_get_list_and_watch_only(chart: helm.Chart) -> None:
    """What policies read as params or context (rbac.contextResources): list and watch, nothing more."""
    values, namespace = SCENARIOS["everything"]
    role = operator_cluster_role(render(chart, values, namespace))
    granted = {verb for group, resource, verb, _ in rules_of(role) if (group, resource) == ("", "limitranges")}
    assert granted == {"list", "watch"}
    defaults = operator_cluster_role(render(chart, *SCENARIOS["defaults"]))
    assert not any(resource == "limitranges" for _, resource, _, _ in rules_of(defaults))


def role_in(docs: list[dict], namespace: str) -> tuple[dict, dict]:
    """The one Role in ``namespace`` and the one RoleBinding that grants it."""
    (role,) = [d for d in all_of(docs, "Role") if d["metadata"]["namespace"] == namespace]
    (binding,) = [d for d in all_of(docs, "RoleBinding") if d["metadata"]["namespace"] == namespace]
    assert binding["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "Role",
        "name": role["metadata"]["name"],
    }
    return role, binding


@pytest.mark.parametrize("scenario", ["defaults", "custom-namespace", "everything"])
def test_release_namespace_role_is_the_certificate_secret(chart: helm.Chart, scenario: str) -> None:
    values, namespace = SCENARIOS[scenario]
    docs = render(chart, values, namespace)
    secret = env_of(operator_container(docs))["AP_CERT_SECRET"]
    role, binding = role_in(docs, namespace)
    assert rules_of(role) == {
        ("", "secrets", "create", None),
        ("", "secrets", "get", secret),
        ("", "secrets", "list", secret),    # watched by name (a metadata.name field selector)
        ("", "secrets", "watch", secret),
        ("", "secrets", "update", secret),
        # spec.reportAdmission results handed between replicas (admission-results-<pod>).
        *{("", "configmaps", verb, None) for verb in ("create", "list", "update", "delete")},
        # No events: the operator turns Kopf's posting off and posts its own in "default".
    }
    sa = operator_deployment(docs)["spec"]["template"]["spec"]["serviceAccountName"]
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": sa, "namespace": namespace}]


@pytest.mark.parametrize("scenario", ["defaults", "custom-namespace", "everything"])
def test_events_role_in_default_is_events_create_only(chart: helm.Chart, scenario: str) -> None:
    """Events about AdmissionPolicies (cluster-scoped) go to "default", where `kubectl describe` looks."""
    values, namespace = SCENARIOS[scenario]
    docs = render(chart, values, namespace)
    role, binding = role_in(docs, "default")
    assert rules_of(role) == {("", "events", "create", None)}
    # Named after the release namespace, like the ClusterRoles: releases never share it.
    assert role["metadata"]["name"].startswith(f"{namespace}-")
    sa = operator_deployment(docs)["spec"]["template"]["spec"]["serviceAccountName"]
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": sa, "namespace": namespace}]


@pytest.mark.parametrize("scenario", ["defaults", "custom-namespace", "everything"])
def test_exceptions_are_requested_and_approved_through_roles_granted_explicitly(chart: helm.Chart,
                                                                                scenario: str) -> None:
    """Issue 27: requesting an exception and approving one are separate permissions, and neither
    reaches anyone (admin, edit, view) until a cluster admin binds the role."""
    values, namespace = SCENARIOS[scenario]
    docs = render(chart, values, namespace)
    editor, approver = (cluster_role_ending(docs, suffix) for suffix in EXCEPTION_ROLES)
    group = "policy-operator.dev"
    assert rules_of(editor) == {(group, "admissionpolicyexceptions", verb, None)
                                for verb in ("get", "list", "watch", "create", "update", "patch", "delete")}
    assert rules_of(approver) == {
        *{(group, "admissionpolicyexceptions", verb, None) for verb in ("get", "list", "watch", "patch")},
        # What the operator's SubjectAccessReview asks before it records an approval.
        (group, "admissionpolicyexceptions/approval", "approve", None),
    }
    for role in (editor, approver):
        assert not [label for label in role["metadata"]["labels"] if "aggregate-to" in label]
        assert "aggregationRule" not in role
        assert role["metadata"]["name"].startswith(f"{namespace}-")   # releases never share them
    bound = {d["roleRef"]["name"] for d in docs if d["kind"] in ("RoleBinding", "ClusterRoleBinding")}
    assert not bound & {editor["metadata"]["name"], approver["metadata"]["name"]}
    # Nothing else the chart grants reaches the approval.
    others = [d for d in docs if d["kind"] in ("Role", "ClusterRole") and d is not approver]
    assert not any(verb == "approve" for role in others for _, _, verb, _ in rules_of(role))


def test_exception_roles_keep_their_suffix_within_63_characters(chart: helm.Chart) -> None:
    docs = render(chart, {}, "a-namespace-with-a-name-long-enough-to-cut-the-role-names")
    for suffix in EXCEPTION_ROLES:
        name = cluster_role_ending(docs, suffix)["metadata"]["name"]
        assert len(name) <= 63 and name.endswith(suffix), name


@pytest.mark.parametrize("scenario", ["defaults", "custom-namespace", "everything"])
def test_namespace_admins_manage_tenant_policies_and_viewers_read_them(chart: helm.Chart, scenario: str) -> None:
    """Issue 27: the chart aggregates writing NamespacedAdmissionPolicies into the built-in `admin`
    ClusterRole (bound in a namespace, it reaches that namespace only) and reading them into `view`
    (which Kubernetes aggregates into `edit`); `edit` may not write one, since a tenant policy can deny
    the namespace's writes."""
    values, namespace = SCENARIOS[scenario]
    docs = render(chart, values, namespace)
    editor, viewer = (cluster_role_ending(docs, suffix) for suffix in TENANT_ROLES)
    group, resource = "policy-operator.dev", "namespacedadmissionpolicies"
    assert rules_of(editor) == {(group, resource, verb, None)
                                for verb in ("get", "list", "watch", "create", "update", "patch", "delete")}
    assert rules_of(viewer) == {(group, resource, verb, None) for verb in ("get", "list", "watch")}

    def aggregated_into(role: dict) -> set[str]:
        prefix = "rbac.authorization.k8s.io/aggregate-to-"
        return {label.removeprefix(prefix) for label, value in role["metadata"]["labels"].items()
                if label.startswith(prefix) and value == "true"}
    assert aggregated_into(editor) == {"admin"}
    assert aggregated_into(viewer) == {"view"}
    for role in (editor, viewer):
        assert "aggregationRule" not in role
        assert role["metadata"]["name"].startswith(f"{namespace}-")   # releases never share them
    bound = {d["roleRef"]["name"] for d in docs if d["kind"] in ("RoleBinding", "ClusterRoleBinding")}
    assert not bound & {editor["metadata"]["name"], viewer["metadata"]["name"]}


def test_tenant_policies_can_be_left_out_of_the_built_in_roles(chart: helm.Chart) -> None:
    docs = render(chart, {"rbac": {"aggregateTenantPolicies": False}})
    assert [d["metadata"]["name"] for d in all_of(docs, "ClusterRole") if d["metadata"]["name"].endswith(TENANT_ROLES)
            ] == []
    assert not [label for role in all_of(docs, "ClusterRole") for label in role["metadata"]["labels"]
                if "aggregate-to" in label]
    # The operator itself still reconciles them.
    operator_rules = rules_of(operator_cluster_role(docs))
    assert ("policy-operator.dev", "namespacedadmissionpolicies", "watch", None) in operator_rules


def test_tenant_roles_keep_their_suffix_within_63_characters(chart: helm.Chart) -> None:
    docs = render(chart, {}, "a-namespace-with-a-name-long-enough-to-cut-the-role-names")
    for suffix in TENANT_ROLES:
        name = cluster_role_ending(docs, suffix)["metadata"]["name"]
        assert len(name) <= 63 and name.endswith(suffix), name


def test_rbac_create_false_renders_no_roles(chart: helm.Chart) -> None:
    docs = render(chart, {"rbac": {"create": False}})
    assert [d for d in docs if d["kind"] in ("Role", "ClusterRole") and not d["metadata"].get("annotations", {})
            .get("helm.sh/hook")] == []


# --------------------------------------------------------------------------------------------
# uninstall safety


@pytest.mark.parametrize("scenario", ["defaults", "custom-namespace", "everything"])
def test_uninstall_hook_deletes_exactly_what_the_operator_created(chart: helm.Chart, scenario: str) -> None:
    values, namespace = SCENARIOS[scenario]
    docs = render(chart, values, namespace)
    config = env_of(operator_container(docs))["AP_WEBHOOK_CONFIG_NAME"]
    hooks = [d for d in docs if "helm.sh/hook" in d["metadata"].get("annotations", {})]
    assert sorted(d["kind"] for d in hooks) == ["ClusterRole", "ClusterRoleBinding", "Job", "ServiceAccount"]
    for hook in hooks:
        annotations = hook["metadata"]["annotations"]
        assert "pre-delete" in annotations["helm.sh/hook"].split(",")
        assert set(annotations["helm.sh/hook-delete-policy"].split(",")) == {"before-hook-creation", "hook-succeeded"}
    weight = {d["kind"]: int(d["metadata"]["annotations"]["helm.sh/hook-weight"]) for d in hooks}
    assert weight["ServiceAccount"] < weight["Job"] and weight["ClusterRole"] < weight["Job"]
    assert weight["ClusterRoleBinding"] < weight["Job"]

    role = one(hooks, "ClusterRole")
    # Its two webhook configurations by name; native enforcement's generated policies and bindings
    # by label (cli/uninstall.py lists them, releases their finalizer with a patch, deletes them).
    assert rules_of(role) == {
        ("admissionregistration.k8s.io", "validatingwebhookconfigurations", "delete", config),
        ("admissionregistration.k8s.io", "mutatingwebhookconfigurations", "delete", config),
        *(("admissionregistration.k8s.io", resource, verb, None)
          for resource in ("validatingadmissionpolicies", "validatingadmissionpolicybindings",
                           "mutatingadmissionpolicies", "mutatingadmissionpolicybindings")
          for verb in ("list", "patch", "delete")),
    }
    sa = one(hooks, "ServiceAccount")
    binding = one(hooks, "ClusterRoleBinding")
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": sa["metadata"]["name"], "namespace": namespace}]

    job = one(hooks, "Job")
    pod = job["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == sa["metadata"]["name"]
    (container,) = pod["containers"]
    assert container["image"] == operator_container(docs)["image"]
    # The command that removes both (cleanup-webhooks leaves the generated policies in force).
    assert container["command"] + container["args"] == ["admission-policy", "cleanup", "--name", config]
    assert container["securityContext"] == operator_container(docs)["securityContext"]
    job_pod_labels = job["spec"]["template"]["metadata"]["labels"]
    # The cleanup pod must never become an endpoint of the webhook Service.
    assert not labels_match(webhook_service(docs)["spec"]["selector"], job_pod_labels)


@pytest.mark.parametrize("scenario", list(SCENARIOS))
def test_feature_gates_reach_the_operator_as_it_parses_them(chart: helm.Chart, scenario: str) -> None:
    values, namespace = SCENARIOS[scenario]
    text = env_of(operator_container(render(chart, values, namespace)))["AP_FEATURE_GATES"]
    gates = features.parse(text)   # what the operator does at startup: an unknown gate would stop it
    assert dict(gates.overrides) == values.get("featureGates", {})


def test_operator_and_its_namespace_are_exempt_from_its_own_webhooks(chart: helm.Chart) -> None:
    values, namespace = SCENARIOS["custom-exempt"]
    docs = render(chart, values, namespace)
    env = env_of(operator_container(docs))
    assert env["AP_EXEMPT_NAMESPACES"] == "kube-system,cert-manager,monitoring"
    assert env["AP_NAMESPACE"] == {"fieldRef": {"fieldPath": "metadata.namespace"}}
    assert env_of(operator_container(render(chart)))["AP_EXEMPT_NAMESPACES"] == "kube-system"


# --------------------------------------------------------------------------------------------
# the Deployment


@pytest.mark.parametrize("scenario", list(SCENARIOS))
def test_deployment_security_context(chart: helm.Chart, scenario: str) -> None:
    values, namespace = SCENARIOS[scenario]
    docs = render(chart, values, namespace)
    pod = operator_deployment(docs)["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] == 10001
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    container = operator_container(docs)
    sc = container["securityContext"]
    assert sc["runAsNonRoot"] is True
    assert sc["readOnlyRootFilesystem"] is True
    assert sc["allowPrivilegeEscalation"] is False
    assert sc["privileged"] is False
    assert sc["capabilities"] == {"drop": ["ALL"]}
    assert sc["seccompProfile"] == {"type": "RuntimeDefault"}
    (mount,) = [m for m in container["volumeMounts"] if m["mountPath"] == "/tmp"]
    (volume,) = [v for v in pod["volumes"] if v["name"] == mount["name"]]
    assert "emptyDir" in volume
    assert env_of(container)["AP_CERT_DIR"].startswith("/tmp/")
    assert container["resources"]["requests"] and container["resources"]["limits"]
    assert set(container["resources"]["limits"]) >= {"cpu", "memory"}


@pytest.mark.parametrize("scenario", list(SCENARIOS))
def test_every_object_the_chart_writes_carries_the_break_glass_label(chart: helm.Chart, scenario: str) -> None:
    """So that its installer, when a break-glass identity, installs, upgrades and uninstalls it
    whatever policies are in place (hooks and the optional report CRDs included)."""
    values, namespace = SCENARIOS[scenario]
    docs = render(chart, {**values, "reports": {**values.get("reports", {}), "installCRDs": True}}, namespace)
    assert any(d["kind"] == "CustomResourceDefinition" for d in docs)
    unlabelled = [f"{d['kind']} {d['metadata']['name']}" for d in docs
                  if (d["metadata"].get("labels") or {}).get(BREAK_GLASS_LABEL) != "true"]
    assert unlabelled == []
    # The Pods go without: the controllers create them in the release namespace, never judged.
    template = operator_deployment(docs)["spec"]["template"]
    assert BREAK_GLASS_LABEL not in template["metadata"]["labels"]


def test_break_glass_identities_reach_the_operator_as_it_parses_them(chart: helm.Chart) -> None:
    def break_glass(values: dict[str, Any], namespace: str = NAMESPACE) -> tuple[tuple[str, ...], tuple[str, ...]]:
        env = env_of(operator_container(render(chart, values, namespace)))
        config = OperatorConfig.from_env({k: v for k, v in env.items() if k.startswith("AP_BREAK_GLASS_")})
        return config.break_glass_groups, config.break_glass_users

    own = f"system:serviceaccount:{NAMESPACE}:{RELEASE}-admission-policy-operator"
    assert break_glass({}) == (("system:masters",), (own,))
    chosen = {"breakGlass": {"groups": [], "users": ["system:serviceaccount:argocd:argocd-application-controller"]},
              "serviceAccount": {"name": "apo"}}
    assert break_glass(chosen, "policies") == ((), ("system:serviceaccount:argocd:argocd-application-controller",
                                                     "system:serviceaccount:policies:apo"))


def test_default_replicas_and_anti_affinity(chart: helm.Chart) -> None:
    docs = render(chart)
    deployment = operator_deployment(docs)
    assert deployment["spec"]["replicas"] == 2
    assert deployment["spec"]["strategy"]["rollingUpdate"]["maxUnavailable"] == 0
    pod = deployment["spec"]["template"]
    (term,) = pod["spec"]["affinity"]["podAntiAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
    assert term["podAffinityTerm"]["topologyKey"] == "kubernetes.io/hostname"
    assert labels_match(term["podAffinityTerm"]["labelSelector"]["matchLabels"], pod["metadata"]["labels"])
    assert labels_match(deployment["spec"]["selector"]["matchLabels"], pod["metadata"]["labels"])


def test_scheduling_overrides(chart: helm.Chart) -> None:
    values, namespace = SCENARIOS["everything"]
    docs = render(chart, values, namespace)
    pod = operator_deployment(docs)["spec"]["template"]["spec"]
    assert pod["nodeSelector"] == values["nodeSelector"]
    assert pod["tolerations"] == values["tolerations"]
    assert pod["priorityClassName"] == "system-cluster-critical"
    assert pod["imagePullSecrets"] == [{"name": "regcred"}]
    assert "requiredDuringSchedulingIgnoredDuringExecution" in pod["affinity"]["podAntiAffinity"]
    assert operator_container(docs)["image"] == "registry.example.com/apo@sha256:" + "ab" * 32

    custom = {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [{"matchExpressions": [{"key": "pool", "operator": "In", "values": ["ops"]}]}]
            }
        }
    }
    pod = operator_deployment(render(chart, {"affinity": custom}))["spec"]["template"]["spec"]
    assert pod["affinity"] == custom


def test_default_image_tag_is_the_app_version(chart: helm.Chart) -> None:
    image = operator_container(render(chart))["image"]
    assert image == f"ghcr.io/policy-operator/admission-policy-operator:{chart.metadata['appVersion']}"


# Settings the chart leaves at the operator's defaults, on purpose; every other setting it sets.
CHART_LEAVES_AT_DEFAULT = {
    "AP_LISTEN_HOST",       # 0.0.0.0: every (IPv4) address of the pod
    "AP_ADVERTISE_HOST",    # for an operator run outside the cluster; in-cluster, the Service is the way in
    "AP_ADVERTISE_PORT",    # the port in that url: ditto
    "AP_MAX_CONNECTIONS",   # 256, as the chart README says; no chart value exposes it
}
# Variables for Kopf, not settings of the operator.
KOPF_ENV = {"POD_ID"}       # its peer identity (kopf._core.engines.peering.detect_own_id)


@pytest.mark.parametrize("scenario", list(SCENARIOS))
def test_chart_env_and_operator_settings_agree(chart: helm.Chart, scenario: str) -> None:
    """Both ways: a variable the chart sets that the operator does not read is a typo, silently
    ignored; a setting the chart neither sets nor lists above is one its users cannot reach."""
    values, namespace = SCENARIOS[scenario]
    chart_env = set(env_of(operator_container(render(chart, values, namespace)))) - KOPF_ENV
    settings = {setting.env for setting in SETTINGS.values()}
    assert chart_env - settings == set(), "the chart sets variables that are no setting of OperatorConfig"
    assert settings - chart_env - CHART_LEAVES_AT_DEFAULT == set(), \
        "settings the chart neither sets nor lists in CHART_LEAVES_AT_DEFAULT"
    assert chart_env & CHART_LEAVES_AT_DEFAULT == set(), "set by the chart: remove from CHART_LEAVES_AT_DEFAULT"


def test_tenant_policy_limits_reach_the_operator_as_it_parses_them(chart: helm.Chart) -> None:
    def tenant_settings(values: dict[str, Any]) -> tuple[int, int, tuple[str, ...]]:
        env = env_of(operator_container(render(chart, values)))
        config = OperatorConfig.from_env({name: value for name, value in env.items() if name.startswith("AP_TENANT_")})
        return config.tenant_max_policies, config.tenant_max_cost, config.tenant_plugins

    defaults = OperatorConfig()
    assert tenant_settings({}) == (defaults.tenant_max_policies, defaults.tenant_max_cost, ())
    # A cost Helm would write as 1e+15 unless the template converts it back to an integer.
    chosen = {"maxPolicies": 0, "maxCost": 10**15, "plugins": ["image-references", "tls-secrets"]}
    assert tenant_settings({"tenantPolicies": chosen}) == (0, 10**15, ("image-references", "tls-secrets"))


@pytest.mark.parametrize("scenario", list(SCENARIOS))
def test_operator_settings_env(chart: helm.Chart, scenario: str) -> None:
    values, namespace = SCENARIOS[scenario]
    docs = render(chart, values, namespace)
    env = env_of(operator_container(docs))
    assert env["AP_POD_NAME"] == {"fieldRef": {"fieldPath": "metadata.name"}}
    assert env["POD_ID"] == {"fieldRef": {"fieldPath": "metadata.name"}}
    assert env["AP_NAMESPACE"] == {"fieldRef": {"fieldPath": "metadata.namespace"}}
    assert env["AP_LOG_LEVEL"] == values.get("logLevel", "INFO")
    assert env["AP_DEFAULT_FAILURE_POLICY"] == values.get("defaultFailurePolicy", "Fail")
    assert env["AP_WEBHOOK_TIMEOUT"] == str(values.get("webhookTimeoutSeconds", 5))
    assert 1 <= int(env["AP_WEBHOOK_TIMEOUT"]) <= 30
    for name, value in env.items():
        assert isinstance(value, (str, dict)), f"{name} must be a string: {value!r}"
    fullname = f"{RELEASE}-admission-policy-operator"
    assert env["AP_WEBHOOK_CONFIG_NAME"] == values.get("webhook", {}).get("configName", fullname)
    assert env["AP_CERT_SECRET"] == values.get("webhook", {}).get("certSecretName", f"{fullname}-tls")
    assert env["AP_CERT_LIFETIME"] == values.get("webhook", {}).get("certLifetime", "365d")


@pytest.mark.parametrize("scenario", list(SCENARIOS))
def test_probes_are_wired_to_the_health_port(chart: helm.Chart, scenario: str) -> None:
    values, namespace = SCENARIOS[scenario]
    container = operator_container(render(chart, values, namespace))
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports["health"] == int(env_of(container)["AP_HEALTH_PORT"])
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "health"}
    assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "health"}
    assert container["startupProbe"]["httpGet"] == {"path": "/healthz", "port": "health"}


# --------------------------------------------------------------------------------------------
# Services and the PodDisruptionBudget


@pytest.mark.parametrize("scenario", list(SCENARIOS))
def test_webhook_service_matches_the_operator_settings(chart: helm.Chart, scenario: str) -> None:
    values, namespace = SCENARIOS[scenario]
    docs = render(chart, values, namespace)
    container = operator_container(docs)
    env = env_of(container)
    service = webhook_service(docs)
    assert service["metadata"]["name"] == env["AP_SERVICE_NAME"]
    assert service["metadata"]["namespace"] == namespace
    (port,) = service["spec"]["ports"]
    assert port["port"] == int(env["AP_SERVICE_PORT"]) == 443
    assert port["targetPort"] == int(env["AP_LISTEN_PORT"])
    container_ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert container_ports["webhook"] == int(env["AP_LISTEN_PORT"])
    assert labels_match(service["spec"]["selector"], pod_labels(docs))


@pytest.mark.parametrize("scenario", list(SCENARIOS))
def test_metrics_service(chart: helm.Chart, scenario: str) -> None:
    values, namespace = SCENARIOS[scenario]
    docs = render(chart, values, namespace)
    container = operator_container(docs)
    env = env_of(container)
    container_ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    metrics = [d for d in all_of(docs, "Service") if component_of(d) == "metrics"]
    if values.get("metrics", {}).get("enabled", True):
        (service,) = metrics
        (port,) = service["spec"]["ports"]
        assert port["targetPort"] == int(env["AP_METRICS_PORT"]) == container_ports["metrics"]
        assert labels_match(service["spec"]["selector"], pod_labels(docs))
    else:
        assert metrics == []
        assert env["AP_METRICS_PORT"] == "0"
        assert "metrics" not in container_ports


@pytest.mark.parametrize("scenario", list(SCENARIOS))
def test_pod_disruption_budget(chart: helm.Chart, scenario: str) -> None:
    values, namespace = SCENARIOS[scenario]
    docs = render(chart, values, namespace)
    replicas = operator_deployment(docs)["spec"]["replicas"]
    pdbs = all_of(docs, "PodDisruptionBudget")
    if replicas == 1:
        assert pdbs == []
        return
    (pdb,) = pdbs
    assert pdb["metadata"]["namespace"] == namespace
    assert 1 <= pdb["spec"]["minAvailable"] < replicas
    assert labels_match(pdb["spec"]["selector"]["matchLabels"], pod_labels(docs))


@pytest.mark.parametrize("scenario", list(SCENARIOS))
def test_network_policy_admits_only_the_webhook_and_metrics_ports(chart: helm.Chart, scenario: str) -> None:
    values, namespace = SCENARIOS[scenario]
    docs = render(chart, values, namespace)
    env = env_of(operator_container(docs))
    policy = one(docs, "NetworkPolicy")
    assert policy["metadata"]["namespace"] == namespace
    assert policy["spec"]["policyTypes"] == ["Ingress"]      # egress: the operator calls the API server
    selector = policy["spec"]["podSelector"]["matchLabels"]
    assert labels_match(selector, pod_labels(docs))
    assert not labels_match(selector, one(docs, "Job")["spec"]["template"]["metadata"].get("labels", {}))
    allowed = {rule["ports"][0]["port"]: rule.get("from") for rule in policy["spec"]["ingress"]}
    assert all(len(rule["ports"]) == 1 and rule["ports"][0]["protocol"] == "TCP" for rule in policy["spec"]["ingress"])
    chosen = values.get("networkPolicy", {})
    expected = {int(env["AP_LISTEN_PORT"]): chosen.get("webhookFrom")}
    if env["AP_METRICS_PORT"] != "0":
        expected[int(env["AP_METRICS_PORT"])] = chosen.get("metricsFrom")
    assert allowed == expected        # the health port: only the kubelet, which a policy never blocks
    assert int(env["AP_HEALTH_PORT"]) not in allowed


def test_network_policy_can_be_turned_off(chart: helm.Chart) -> None:
    assert all_of(render(chart, {"networkPolicy": {"enabled": False}}), "NetworkPolicy") == []


def test_custom_namespace_everywhere(chart: helm.Chart) -> None:
    values, namespace = SCENARIOS["custom-namespace"]
    docs = render(chart, values, namespace)
    cluster_scoped = {"ClusterRole", "ClusterRoleBinding", "ClusterKopfPeering"}
    for doc in docs:
        if doc["kind"] in cluster_scoped:
            assert "namespace" not in doc["metadata"]
            assert doc["metadata"]["name"].startswith(namespace) or doc["kind"] == "ClusterKopfPeering"
        elif doc["kind"] in ("Role", "RoleBinding") and doc["metadata"]["namespace"] == "default":
            assert doc["metadata"]["name"].startswith(namespace)  # the events Role, see role.yaml
        else:
            assert doc["metadata"]["namespace"] == namespace, doc["kind"]
        for subject in doc.get("subjects", []):
            assert subject["namespace"] == namespace


# --------------------------------------------------------------------------------------------
# values.schema.json, enforced by the real engine


@pytest.mark.parametrize(
    ("values", "expected"),
    [
        ({"replicaCount": "two"}, r"/replicaCount.*got string, want integer"),
        ({"replicaCount": 0}, r"/replicaCount.*minimum"),
        ({"defaultFailurePolicy": "Sometimes"}, r"/defaultFailurePolicy.*'Fail', 'Ignore'"),
        ({"logLevel": "TRACE"}, r"/logLevel.*'DEBUG', 'INFO', 'WARNING', 'ERROR'"),
        ({"webhookTimeoutSeconds": 31}, r"/webhookTimeoutSeconds.*maximum"),
        ({"exemptNamespaces": "kube-system"}, r"/exemptNamespaces.*got string, want array"),
        ({"exemptNamespaces": ["Kube_System"]}, r"/exemptNamespaces/0"),
        ({"metrics": {"enabled": "no"}}, r"/metrics/enabled.*got string, want boolean"),
        ({"featureGates": {"TLSSecretsPlugin": "off"}}, r"/featureGates/TLSSecretsPlugin.*got string, want boolean"),
        ({"featureGates": ["TLSSecretsPlugin=false"]}, r"/featureGates.*got array, want object"),
        ({"replicas": 2}, r"additional properties 'replicas' not allowed"),
        ({"podAntiAffinity": "sometimes"}, r"/podAntiAffinity"),
        ({"networkPolicy": {"webhookFrom": ["10.0.0.0/8"]}}, r"/networkPolicy/webhookFrom/0.*got string, want object"),
        (
            {"networkPolicy": {"metricsFrom": [{"cidr": "10.0.0.0/8"}]}},
            r"/networkPolicy/metricsFrom/0.*'cidr' not allowed",
        ),
        ({"networkPolicy": {"webhookFrom": [{"ipBlock": {}}]}}, r"/networkPolicy/webhookFrom/0/ipBlock.*cidr"),
        (
            {"rbac": {"extraRules": [{"apiGroups": ["*"], "resources": ["pods"], "verbs": ["get"]}]}},
            r"/rbac/extraRules/0/apiGroups/0",
        ),
        (
            {"rbac": {"extraRules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["*"]}]}},
            r"/rbac/extraRules/0/verbs/0",
        ),
        (
            {"rbac": {"contextResources": [{"apiGroups": ["apps"], "resources": ["*"]}]}},
            r"/rbac/contextResources/0/resources/0",
        ),
        ({"rbac": {"aggregateTenantPolicies": "yes"}}, r"/rbac/aggregateTenantPolicies.*got string, want boolean"),
        ({"tenantPolicies": {"maxPolicies": -1}}, r"/tenantPolicies/maxPolicies.*minimum"),
        ({"tenantPolicies": {"plugins": "image-references"}}, r"/tenantPolicies/plugins.*got string, want array"),
        ({"tenantPolicies": {"plugins": ["Image References"]}}, r"/tenantPolicies/plugins/0"),
    ],
)
def test_schema_rejects_bad_values(chart: helm.Chart, values: dict[str, Any], expected: str) -> None:
    with pytest.raises(helm.HelmValuesError) as raised:
        chart.render(values, name=RELEASE, namespace=NAMESPACE)
    message = str(raised.value)
    assert "values don't meet the specifications of the schema" in message
    assert re.search(expected, message), message
    # `helm lint` reports the same as an error.
    report = helm.lint(CHART_DIR, values)
    assert any(re.search(expected, error) for error in report["errors"]), report


def test_schema_is_draft7_and_closed() -> None:
    schema = json.loads((CHART_DIR / "values.schema.json").read_text())
    assert schema["$schema"] == "http://json-schema.org/draft-07/schema#"
    assert schema["additionalProperties"] is False
    defaults = yaml.safe_load((CHART_DIR / "values.yaml").read_text())
    jsonschema.Draft7Validator(schema).validate(defaults)


@pytest.mark.parametrize(
    ("values", "expected"),
    [
        ({"metrics": {"port": 9443}}, "must be distinct"),
        ({"health": {"port": 9443}}, "must be distinct"),
        ({"replicaCount": 2, "podDisruptionBudget": {"minAvailable": 2}}, "must be lower than replicaCount"),
    ],
)
def test_template_rejects_inconsistent_values(chart: helm.Chart, values: dict[str, Any], expected: str) -> None:
    with pytest.raises(helm.HelmRenderError, match=expected):
        chart.render(values, name=RELEASE, namespace=NAMESPACE)


def test_notes_render(chart: helm.Chart) -> None:
    notes = chart.render({}, name=RELEASE, namespace=NAMESPACE)["admission-policy-operator/templates/NOTES.txt"]
    assert "kube-system, policy-system" in notes
    sa = f"system:serviceaccount:{NAMESPACE}:{RELEASE}-admission-policy-operator"
    assert f"written by group system:masters or {sa}\nonly, objects labelled" in notes, notes
    notes = chart.render({"breakGlass": {"groups": []}}, name=RELEASE, namespace=NAMESPACE)[
        "admission-policy-operator/templates/NOTES.txt"]
    assert f"written by {sa}\nonly" in notes, notes
    notes = chart.render({"cleanupHook": {"enabled": False}}, name=RELEASE, namespace=NAMESPACE)[
        "admission-policy-operator/templates/NOTES.txt"
    ]
    assert "WARNING" in notes and "kubectl delete validatingwebhookconfiguration" in notes
    assert f"admission-policy cleanup --name {RELEASE}-admission-policy-operator\n" in notes, notes


# --------------------------------------------------------------------------------------------
# the image the chart runs


def test_notes_say_how_to_get_the_image_while_none_is_published(chart: helm.Chart) -> None:
    notes = "admission-policy-operator/templates/NOTES.txt"
    default = chart.render({}, name=RELEASE, namespace=NAMESPACE)[notes]
    assert "no registry publishes the default image" in default and "kind load docker-image" in default
    own = chart.render({"image": {"repository": "registry.example.com/apo", "tag": "1.0"}}, name=RELEASE,
                       namespace=NAMESPACE)[notes]
    assert "no registry publishes" not in own


def test_dockerfile_matches_the_chart() -> None:
    dockerfile = (ROOT / "Dockerfile").read_text()
    stages = re.findall(r"^FROM\s+(\S+)(?:\s+AS\s+(\S+))?", dockerfile, flags=re.MULTILINE | re.IGNORECASE)
    assert len(stages) >= 2, "multi-stage build expected"
    assert stages[-1][0] == "python:3.11-slim"
    users = re.findall(r"^USER\s+(\S+)", dockerfile, flags=re.MULTILINE)
    assert users and users[-1].split(":")[0] == "10001"
    defaults = yaml.safe_load((CHART_DIR / "values.yaml").read_text())
    assert defaults["podSecurityContext"]["runAsUser"] == 10001
    (entrypoint,) = re.findall(r"^ENTRYPOINT\s+(.+)$", dockerfile, flags=re.MULTILINE)
    assert json.loads(entrypoint) == ["admission-policy", "run"]
    assert (ROOT / ".dockerignore").is_file()


# --------------------------------------------------------------------------------------------
# the README's RBAC table says what every granted verb is for (issue 12, scenario 8)


def readme_rbac_table(role: str = "") -> set[tuple[str, str, str, bool]]:
    """(group, resource, verb, restricted by name) of every row of the chart README's RBAC table;
    with ``role``, of the rows whose group cell names it (``ClusterRole `…-cleanup```).

    A group cell is its first backticked word; a resource cell lists backticked resources, or
    "same" for the row above's, and says ``resourceNames`` when the rule is narrowed to names.
    """
    text = (CHART_DIR / "README.md").read_text()
    table = text.split("## RBAC", 1)[1].split("| Why |", 1)[1].split("\n\n", 1)[0]
    granted: set[tuple[str, str, str, bool]] = set()
    previous: list[str] = []
    for row in table.strip().splitlines()[1:]:   # after the |---| line
        group_cell, resource_cell, verb_cell, why = (cell.strip() for cell in row.strip("|").split("|"))
        assert why, f"no reason given in {row!r}"
        group = re.findall(r"`([^`]*)`", group_cell)[0].strip('"')
        named = "resourceNames" in resource_cell
        listed = [r for r in re.findall(r"`([^`]*)`", resource_cell) if not r.startswith("resourceNames")]
        resources = previous if resource_cell.startswith("same") else listed
        previous = resources
        if role not in group_cell:
            continue
        granted |= {(group, resource, verb.strip(), named) for resource in resources for verb in verb_cell.split(",")}
    return granted


@pytest.mark.parametrize("scenario", ["defaults", "everything"])
def test_the_readme_rbac_table_lists_exactly_the_rules_the_chart_grants(chart: helm.Chart, scenario: str) -> None:
    values, namespace = SCENARIOS[scenario]
    docs = render(chart, values, namespace)
    extra = {(group, resource, verb, False) for rule in (values or {}).get("rbac", {}).get("extraRules", [])
             for group in rule["apiGroups"] for resource in rule["resources"] for verb in rule["verbs"]}
    extra |= {(group, resource, verb, False) for rule in (values or {}).get("rbac", {}).get("contextResources", [])
              for group in rule["apiGroups"] for resource in rule["resources"] for verb in ("list", "watch")}
    rendered = {(group, resource, verb, name is not None)
                for role in docs if role["kind"] in ("Role", "ClusterRole")
                for group, resource, verb, name in rules_of(role)} - extra
    documented = readme_rbac_table()
    assert rendered - documented == set(), "granted by the chart, not explained in its README"
    assert documented - rendered == set(), "in the README's RBAC table, not granted by the chart"


def test_the_readme_rbac_table_lists_exactly_what_the_uninstall_hook_is_granted(chart: helm.Chart) -> None:
    hook = next(d for d in render(chart) if d["kind"] == "ClusterRole" and d["metadata"]["name"].endswith("-cleanup"))
    granted = {(group, resource, verb, name is not None) for group, resource, verb, name in rules_of(hook)}
    assert readme_rbac_table("ClusterRole `…-cleanup`") == granted



@pytest.mark.parametrize("scenario", list(SCENARIOS))
def test_the_pods_ask_for_nothing_beyond_an_unprivileged_container(chart: helm.Chart, scenario: str) -> None:
    """Non-root with a read-only root filesystem (test_deployment_security_context) and nothing else:
    no host namespaces, ports or paths, no added capabilities, scratch space in an emptyDir only."""
    values, namespace = SCENARIOS[scenario]
    docs = render(chart, values, namespace)
    jobs = [d["spec"]["template"]["spec"] for d in all_of(docs, "Job")]
    for pod in [operator_deployment(docs)["spec"]["template"]["spec"], *jobs]:
        for field in ("hostNetwork", "hostPID", "hostIPC", "shareProcessNamespace"):
            assert pod.get(field) in (None, False), field
        assert all(set(volume) - {"name"} <= {"emptyDir"} for volume in pod.get("volumes") or []), pod["volumes"]
        for container in [*pod.get("initContainers", []), *pod["containers"]]:
            sc = container["securityContext"]
            assert sc["allowPrivilegeEscalation"] is False and sc["readOnlyRootFilesystem"] is True
            assert "add" not in sc["capabilities"], sc
            assert all("hostPort" not in port for port in container.get("ports") or []), container["ports"]

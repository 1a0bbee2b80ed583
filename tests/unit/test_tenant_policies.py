"""NamespacedAdmissionPolicies (issue 27): a tenant's policy parses with its namespace in its name,
judges its own namespace only, never weakens a cluster policy, and is refused at apply when it
reaches beyond its namespace (``api._check_tenant``, ``operator/tenancy.py``), calls a plugin the
cluster admin does not allow, or goes over its namespace's limits."""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest

from admission_policy import api
from admission_policy.api import PolicyError, parse_policy
from admission_policy.cluster.discovery import DiscoveredResource
from admission_policy.config import OperatorConfig
from admission_policy.engine import CompiledPolicy, PolicySet, compile_policy, load_policy
from admission_policy.operator.tenancy import COST_SIZES, tenant_problems
from builders import decide, deployment, namespace_object, pod, policy, policy_body, request, rule

TEAM = "team-a"
NO_BAD = {"expression": "object.metadata.name != 'bad'", "message": "no bad names here"}
EVERYTHING = rule("*", group="*", version="*", operations=["*"])


def tenant_body(name: str = "p", namespace: str | None = TEAM, **spec: Any) -> dict[str, Any]:
    """A NamespacedAdmissionPolicy manifest (``policy_body``'s spec), in ``namespace`` (None: left out)."""
    body = policy_body(name, **spec)
    body["kind"] = api.NAMESPACED_KIND
    if namespace is not None:
        body["metadata"]["namespace"] = namespace
    return body


def tenant(name: str = "p", namespace: str = TEAM, **spec: Any) -> CompiledPolicy:
    return compile_policy(parse_policy(tenant_body(name, namespace, **spec)))


# --- the API ------------------------------------------------------------------------------------------------

def test_a_tenant_policy_is_named_after_its_namespace() -> None:
    parsed = parse_policy(tenant_body("no-bad", validations=[NO_BAD]))
    assert parsed.name == "team-a/no-bad" and parsed.namespace == TEAM
    assert parsed.kind == api.NAMESPACED_KIND and parsed.object_name == "no-bad"


def test_a_policy_key_names_the_kind_and_reads_back_from_its_text() -> None:
    """The text reports, metrics and events carry ("team-a/no-bad") reads back to the same policy,
    and the key of an object read from the API is the key of the policy parsed from it."""
    body = tenant_body("no-bad", validations=[NO_BAD])
    key = parse_policy(body).key
    assert key == api.PolicyKey(api.NAMESPACED_KIND, TEAM, "no-bad") == api.PolicyKey.of(body)
    assert str(key) == "team-a/no-bad" and api.PolicyKey.parse(str(key)) == key
    cluster = parse_policy(policy_body("no-bad", validations=[NO_BAD])).key
    assert (str(cluster), cluster.kind, cluster.namespace) == ("no-bad", api.KIND, None)
    assert api.PolicyKey.parse("no-bad") == cluster


def test_a_cluster_policy_is_unchanged() -> None:
    parsed = parse_policy(policy_body("no-bad", validations=[NO_BAD],
                                      context=[{"name": "cms", "version": "v1", "resource": "configmaps"}]))
    assert parsed.name == "no-bad" and parsed.namespace is None and parsed.kind == api.KIND
    assert parsed.context[0].scope == "All"


def test_a_tenant_policys_context_reads_its_own_namespace_by_default() -> None:
    parsed = parse_policy(tenant_body(validations=[NO_BAD],
                                      context=[{"name": "cms", "version": "v1", "resource": "configmaps"}]))
    assert parsed.context[0].scope == "RequestNamespace"


PARAMS = {"paramKind": {"apiVersion": "v1", "kind": "ConfigMap"}}


@pytest.mark.parametrize(("spec", "path"), [
    pytest.param({"match": {"namespaceSelector": {"matchLabels": {"team": "b"}}}}, "spec.match.namespaceSelector",
                 id="namespace-selector"),
    pytest.param({"match": {"excludeNamespaces": ["team-b"]}}, "spec.match.excludeNamespaces",
                 id="exclude-namespaces"),
    pytest.param({**PARAMS, "paramRef": {"name": "limits", "namespace": "team-b"}}, "spec.paramRef.namespace",
                 id="params-of-another-namespace"),
    pytest.param({"context": [{"name": "cms", "version": "v1", "resource": "configmaps", "scope": "All"}]},
                 "spec.context[0].scope", id="context-everywhere"),
])
def test_what_reaches_beyond_its_namespace_is_refused_naming_the_field(spec: dict[str, Any], path: str) -> None:
    with pytest.raises(PolicyError) as caught:
        parse_policy(tenant_body(validations=[NO_BAD], **spec))
    assert caught.value.path == path
    assert "own namespace" in caught.value.message


def test_params_of_its_own_namespace_may_be_named() -> None:
    parsed = parse_policy(tenant_body(validations=[NO_BAD], **PARAMS, paramRef={"name": "limits", "namespace": TEAM}))
    assert parsed.param_ref is not None and parsed.param_ref.namespace == TEAM


def test_a_tenant_policy_without_a_namespace_is_refused() -> None:
    with pytest.raises(PolicyError) as caught:
        parse_policy(tenant_body(namespace=None, validations=[NO_BAD]))
    assert caught.value.path == "metadata.namespace"


# --- judging: its own namespace only ------------------------------------------------------------------------

def test_a_tenant_policy_denies_in_its_namespace_only() -> None:
    no_bad = tenant("no-bad", validations=[NO_BAD])
    denied = decide(no_bad, pod("bad", namespace=TEAM))
    assert not denied.allowed and "team-a/no-bad" in denied.message and "no bad names here" in denied.message
    assert decide(no_bad, pod("bad", namespace="team-b")).allowed


def test_a_tenant_policy_never_judges_cluster_scoped_objects_nor_its_namespace() -> None:
    """A Namespace's request carries the Namespace's own name as its namespace: the tenant must not
    judge (so refuse the deletion of, or relabel) the namespace it lives in."""
    deny_all = tenant(rules=[EVERYTHING], validations=[{"expression": "false", "message": "nothing"}])
    assert not decide(deny_all, pod(namespace=TEAM)).allowed   # it does judge
    for operation in ("CREATE", "UPDATE", "DELETE"):
        own = namespace_object({"team": "a"}, name=TEAM)
        assert decide(deny_all, request(own if operation != "DELETE" else None, old=own, operation=operation,
                                        resource="namespaces", kind="Namespace", name=TEAM, namespace=TEAM)).allowed
    cluster_role = {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole", "metadata": {"name": "x"}}
    assert decide(deny_all, request(cluster_role, resource="clusterroles", group="rbac.authorization.k8s.io",
                                    kind="ClusterRole", namespace=None)).allowed


def test_its_pod_rules_judge_workload_templates_in_its_namespace_only() -> None:
    no_privileged = tenant("no-privileged", validations=[{
        "expression": "object.spec.containers.all(c, !c.?securityContext.?privileged.orValue(false))",
        "message": "no privileged containers"}])
    denied = decide(no_privileged, deployment(namespace=TEAM, privileged=True))
    assert not denied.allowed and "no privileged containers" in denied.message
    assert decide(no_privileged, deployment(namespace="team-b", privileged=True)).allowed


@pytest.mark.parametrize("enforcement", ["Enforce", "Warn", "Audit"])
def test_a_tenant_policy_cannot_weaken_a_cluster_policy(enforcement: str) -> None:
    """Both are evaluated and a deny wins, whatever the tenant's policy says of the same objects."""
    cluster = policy("no-bad", validations=[NO_BAD])
    lenient = tenant("anything-goes", enforcement=enforcement, failurePolicy="Ignore", rules=[EVERYTHING],
                     validations=[{"expression": "true"}])
    decision = decide([cluster, lenient], pod("bad", namespace=TEAM))
    assert not decision.allowed and 'AdmissionPolicy "no-bad" denied' in decision.message


def test_a_tenant_mutation_applies_in_its_namespace_only() -> None:
    label = tenant("label", mutations=[{"merge": {"metadata": {"labels": {"team": "a"}}}}])
    assert decide(label, pod(namespace=TEAM)).patched_object["metadata"]["labels"] == {"team": "a"}
    assert decide(label, pod(namespace="team-b")).patch == ()


@pytest.mark.parametrize("cluster_name", ["a-secure", "z-secure"])
def test_a_tenant_mutation_cannot_undo_a_cluster_mutation(cluster_name: str) -> None:
    """The cluster admin's mutation has the last word whatever the names sort as: a tenant policy
    only adds mutations, it does not take back what a cluster policy sets."""
    secure = policy(cluster_name, mutations=[{"merge": {"metadata": {"labels": {"secure": "true"}}}}])
    loosen = tenant("loosen", mutations=[{"merge": {"metadata": {"labels": {"secure": "false"}}}}])
    decision = decide([secure, loosen], pod(namespace=TEAM))
    assert decision.patched_object["metadata"]["labels"]["secure"] == "true"


# --- refused at apply: cluster-scoped kinds, exempt namespaces, the limits ---------------------------------

DISCOVERED = (
    DiscoveredResource("", "v1", "pods", ("status", "exec"), kind="Pod"),
    DiscoveredResource("", "v1", "configmaps", kind="ConfigMap"),
    DiscoveredResource("", "v1", "namespaces", ("status", "finalize"), namespaced=False, kind="Namespace"),
    DiscoveredResource("apps", "v1", "deployments", ("status", "scale"), kind="Deployment"),
    DiscoveredResource("rbac.authorization.k8s.io", "v1", "roles", kind="Role"),
    DiscoveredResource("rbac.authorization.k8s.io", "v1", "clusterroles", namespaced=False, kind="ClusterRole"),
    DiscoveredResource("acme.com", "v1", "quotas", kind="Quota"),
    DiscoveredResource("acme.com", "v1", "clusterquotas", namespaced=False, kind="ClusterQuota"),
)
CONFIG = OperatorConfig(exempt_namespaces=("kube-system", "infra"))


def problems(compiled: CompiledPolicy, enforced: Sequence[CompiledPolicy] = (),
             config: OperatorConfig = CONFIG) -> list[str]:
    return tenant_problems(config, compiled, DISCOVERED, enforced)


def test_a_tenant_policy_on_its_namespaced_kinds_passes() -> None:
    ok = tenant(rules=[rule("pods", "pods/exec"), rule("deployments", group="apps"), rule("roles", group="*"),
                       rule("*", group="*")], validations=[NO_BAD])
    assert problems(ok) == []


@pytest.mark.parametrize(("rules", "field", "named"), [
    pytest.param([rule("namespaces")], "spec.match.resources[0].resources[0]", "namespaces", id="explicit-group"),
    pytest.param([rule("pods", "namespaces/status")], "spec.match.resources[0].resources[1]", "namespaces",
                 id="a-subresource"),
    pytest.param([rule("pods"), rule("clusterroles", group="*")], "spec.match.resources[1].resources[0]",
                 "clusterroles.rbac.authorization.k8s.io", id="any-group"),
    pytest.param([rule("clusterquotas", group="acme.com")], "spec.match.resources[0].resources[0]",
                 "clusterquotas.acme.com", id="a-custom-resource"),
])
def test_a_cluster_scoped_kind_is_refused_naming_the_field(rules: list[dict[str, Any]], field: str,
                                                          named: str) -> None:
    (problem,) = problems(tenant(rules=rules, validations=[NO_BAD]))
    assert problem.startswith(f"{field}: {named} is cluster-scoped")


def test_cluster_scoped_params_or_context_are_refused_naming_the_field() -> None:
    reads = tenant(paramKind={"apiVersion": "acme.com/v1", "kind": "ClusterQuota"}, paramRef={"name": "limits"},
                   context=[{"name": "namespaces", "version": "v1", "resource": "namespaces"}],
                   validations=[{"expression": "params != null && context.namespaces.size() > 0"}])
    found = problems(reads)
    assert [p.partition(":")[0] for p in found] == ["spec.paramKind", "spec.context[0].resource"]
    assert all("cluster-scoped" in p for p in found)
    namespaced = tenant(paramKind={"apiVersion": "acme.com/v1", "kind": "Quota"}, paramRef={"name": "limits"},
                        context=[{"name": "cms", "version": "v1", "resource": "configmaps"}],
                        validations=[{"expression": "params != null && context.cms.size() > 0"}])
    assert problems(namespaced) == []


@pytest.mark.parametrize("namespace", ["kube-system", "infra", "admission-policy-system"])
def test_a_tenant_policy_in_an_exempt_namespace_is_refused(namespace: str) -> None:
    """The webhooks never see its namespace: accepted, it would look enforced and judge nothing."""
    (problem,) = problems(tenant(namespace=namespace, validations=[NO_BAD]))
    assert problem.startswith(f"metadata.namespace: {namespace} is exempt")


def test_one_policy_over_the_namespaces_count_is_refused() -> None:
    limited = OperatorConfig(tenant_max_policies=2)
    held = [tenant("one", validations=[NO_BAD]), tenant("two", validations=[NO_BAD])]
    (problem,) = problems(tenant("three", validations=[NO_BAD]), held, limited)
    assert problem.startswith("metadata.namespace:") and "AP_TENANT_MAX_POLICIES=2" in problem
    # An update of one it holds is not one more; nor is another namespace's policy one of its own.
    assert problems(tenant("two", validations=[NO_BAD, NO_BAD]), held, limited) == []
    assert problems(tenant("three", namespace="team-b", validations=[NO_BAD]), held, limited) == []
    # Cluster policies are the cluster admin's: never counted against a namespace.
    assert problems(tenant("one", validations=[NO_BAD]), [policy("a", validations=[NO_BAD])] * 3, limited) == []


def test_zero_policies_allowed_refuses_every_one() -> None:
    assert problems(tenant(validations=[NO_BAD]), (), OperatorConfig(tenant_max_policies=0))


def test_a_policy_over_the_namespaces_cost_is_refused() -> None:
    cheap = {"expression": "object.spec.containers.all(c, c.image.startsWith('registry.acme.com/'))"}
    one = tenant("one", validations=[cheap])
    limited = OperatorConfig(tenant_max_cost=int(one.cost(COST_SIZES) * 1.5))
    assert problems(one, (), limited) == []
    (problem,) = problems(tenant("two", validations=[cheap]), [one], limited)
    assert problem.startswith("spec:") and "AP_TENANT_MAX_COST" in problem
    # Its own earlier generation is not counted with it, nor are other namespaces' policies.
    assert problems(tenant("one", validations=[cheap]), [one], limited) == []
    assert problems(tenant("two", namespace="team-b", validations=[cheap]), [one], limited) == []


# --- plugins as the cluster admin allows them --------------------------------------------------------------

PLUGIN_RULE = {"plugin": {"name": "image-references", "config": {"allowedRegistries": ["registry.acme.com"]}}}


def test_a_tenant_policy_calling_a_plugin_not_allowed_is_refused_naming_the_field() -> None:
    body = tenant_body(validations=[NO_BAD, PLUGIN_RULE])
    with pytest.raises(PolicyError) as caught:
        load_policy(body, "Fail")
    assert caught.value.path == "spec.validations[1].plugin"
    assert "AP_TENANT_PLUGINS" in caught.value.message
    with pytest.raises(PolicyError):
        load_policy(body, "Fail", ("tls-secrets",))
    assert load_policy(body, "Fail", ("image-references",)).name == "team-a/p"


def test_a_cluster_policy_calls_any_plugin() -> None:
    assert load_policy(policy_body(validations=[PLUGIN_RULE]), "Fail").name == "p"


# --- the index -------------------------------------------------------------------------------------------------

def test_a_request_meets_the_cluster_policies_and_its_own_namespaces_only() -> None:
    """Tenant policies are indexed by namespace: a request never meets another tenant's (issue 33:
    a thousand tenants' policies on Pods made every Pod request look at each of them)."""
    judge = {"validations": [{"expression": "true"}]}
    policies = PolicySet([tenant("mine", **judge), tenant("theirs", namespace="team-b", **judge),
                          policy("cluster", **judge)])

    def names(found: PolicySet, namespace: str) -> list[str]:
        return [p.name for p in found.candidates(request(pod(namespace=namespace), namespace=namespace))]
    assert names(policies, TEAM) == ["cluster", f"{TEAM}/mine"]
    assert names(policies, "team-b") == ["cluster", "team-b/theirs"]
    assert names(policies, "team-c") == ["cluster"]
    # Updates make new sets and leave the old one as it was.
    changed = policies.replace(tenant("mine", rules=[rule("configmaps")], **judge)).remove("team-b/theirs")
    assert names(changed, TEAM) == ["cluster"]
    assert names(changed, "team-b") == ["cluster"]
    assert names(policies, TEAM) == ["cluster", f"{TEAM}/mine"]
    assert names(changed.remove("cluster").remove(f"{TEAM}/mine"), TEAM) == []

"""NamespacedAdmissionPolicies offline: `test`, `lint` and `audit` read them wherever they read an
AdmissionPolicy, name them "namespace/name" with their kind, and judge only their namespace.

What needs the cluster (its limits, discovery of cluster-scoped kinds) is the operator's, at
`kubectl apply`: tests/unit/test_tenant_policies.py and the e2e tier.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner

from admission_policy import api
from admission_policy.cli import main
from admission_policy.cli.audit import listing_scopes
from admission_policy.cluster.discovery import DiscoveredResource
from admission_policy.engine import compile_policy
from builders import deployment, pod, policy_body, rule

EXAMPLE = Path(__file__).parents[2] / "examples" / "tenant-policy"
NEEDS_TEAM = {"expression": "object.metadata.?labels.?team.orValue('') != ''", "message": "a team label is required"}


def run(*args: str, env: dict[str, str | None] | None = None) -> tuple[int, str, str]:
    result = CliRunner().invoke(main, list(args), env={"AP_TENANT_PLUGINS": None, **(env or {})})
    return result.exit_code, result.stdout, result.stderr


def tenant_body(name: str = "require-team", namespace: str | None = "team-a", **spec: Any) -> dict[str, Any]:
    body = policy_body(name, metadata={"namespace": namespace} if namespace else None,
                       **{"validations": [NEEDS_TEAM], **spec})
    return {**body, "kind": api.NAMESPACED_KIND}


def write(path: Path, *bodies: Any) -> Path:
    path.write_text(yaml.safe_dump_all(bodies))
    return path


# --- test ---------------------------------------------------------------------------------------------

def test_the_example_suite_passes() -> None:
    code, out, err = run("test", str(EXAMPLE))
    assert code == 0, out + err
    assert "5 case(s) passed, 0 failed" in out


def test_a_tenant_policy_judges_objects_of_its_namespace_only(tmp_path: Path) -> None:
    policy = write(tmp_path / "policy.yaml", tenant_body())
    in_a = write(tmp_path / "pod-a.yaml", pod(namespace="team-a"))
    in_b = write(tmp_path / "pod-b.yaml", pod(namespace="team-b"))
    code, out, err = run("test", "-p", str(policy), str(in_a), str(in_b))
    assert code == 0, out + err
    assert out.splitlines() == [
        f"{in_a} (pods team-a/web, CREATE): DENIED (403 Forbidden)",
        "  team-a/require-team (Enforce): denied",
        "    - a team label is required",
        f"{in_b} (pods team-b/web, CREATE): ALLOWED",
        "  no policy matched",
    ]


def test_a_suite_reads_tenant_policies_beside_cluster_policies(tmp_path: Path) -> None:
    """Both kinds apply where they select: a cluster policy everywhere, the tenant one in team-a."""
    write(tmp_path / "policies.yaml", tenant_body(),
          policy_body("no-latest", validations=[{"expression": "!object.spec.containers.exists(c, "
                                                               "c.image.endsWith(':latest'))",
                                                 "message": "no latest images"}]))
    write(tmp_path / "test.yaml", {
        "apiVersion": api.API_VERSION, "kind": "AdmissionPolicyTest", "policies": ["policies.yaml"],
        "cases": [
            {"name": "team-a needs a team label", "object": pod(namespace="team-a"),
             "expect": {"allowed": False, "messageContains": ["team-a/require-team", "a team label is required"]}},
            {"name": "team-b does not", "object": pod(namespace="team-b"), "expect": {"allowed": True}},
            {"name": "the cluster policy still applies in team-a", "object":
                pod(namespace="team-a", labels={"team": "a"}, images=["nginx:latest"]),
             "expect": {"allowed": False, "messageContains": ['AdmissionPolicy "no-latest"', "no latest images"]}},
        ]})
    code, out, err = run("test", str(tmp_path))
    assert code == 0, out + err
    assert "3 case(s) passed, 0 failed" in out


def test_a_tenant_policy_file_given_as_an_object_says_how_to_pass_it(tmp_path: Path) -> None:
    policy = write(tmp_path / "policy.yaml", tenant_body())
    code, _, err = run("test", str(policy))
    assert code == 2
    assert f"error: {policy}: a NamespacedAdmissionPolicy is not an object to test: pass policies with -p" in err


# --- what parsing refuses, as `kubectl apply` would -----------------------------------------------------

@pytest.mark.parametrize(("body", "line"), [
    (tenant_body(namespace=None), "invalid NamespacedAdmissionPolicy 'require-team': metadata.namespace: "),
    (tenant_body(match={"namespaceSelector": {"matchLabels": {"team": "b"}}}),
     "invalid NamespacedAdmissionPolicy 'team-a/require-team': spec.match.namespaceSelector: is not allowed: "
     "a NamespacedAdmissionPolicy judges objects in its own namespace (team-a) only"),
    (tenant_body(match={"excludeNamespaces": ["team-a-tmp"]}),
     "invalid NamespacedAdmissionPolicy 'team-a/require-team': spec.match.excludeNamespaces: is not allowed: "),
    (tenant_body(validations=[{"expression": "object.metadata.name +"}]),
     "NamespacedAdmissionPolicy 'team-a/require-team': spec.validations[0].expression (line 1, column 23): "
     "Syntax error"),
])
def test_lint_and_test_name_the_kind_and_namespace_of_an_invalid_tenant_policy(
        tmp_path: Path, body: dict[str, Any], line: str) -> None:
    policy = write(tmp_path / "policy.yaml", body)
    code, out, _ = run("lint", str(policy))
    assert code == 2
    assert f"error  {policy}: {line}" in out, out
    code, _, err = run("test", "-p", str(policy), str(write(tmp_path / "pod.yaml", pod(namespace="team-a"))))
    assert code == 2
    assert f"error: {policy}: {line}" in err, err


def test_a_tenant_policy_calls_only_the_plugins_AP_TENANT_PLUGINS_allows(tmp_path: Path) -> None:
    """As the operator refuses it at `kubectl apply` (none by default); a cluster policy is not limited."""
    plugin = {"plugin": {"name": "image-references", "config": {"requireDigest": True}}}
    tenant = write(tmp_path / "tenant.yaml", tenant_body(validations=[plugin]))
    cluster = write(tmp_path / "cluster.yaml", policy_body("images", validations=[plugin]))
    code, out, _ = run("lint", str(tenant), str(cluster))
    assert code == 2
    assert (f"error  {tenant}: invalid NamespacedAdmissionPolicy 'team-a/require-team': spec.validations[0].plugin: "
            "plugin 'image-references' is not allowed in a NamespacedAdmissionPolicy (the cluster admin allows: none; "
            "setting AP_TENANT_PLUGINS)") in out
    assert f"ok     {cluster}: AdmissionPolicy 'images'" in out

    code, out, _ = run("lint", str(tenant), env={"AP_TENANT_PLUGINS": "image-references"})
    assert code == 0, out
    assert f"ok     {tenant}: NamespacedAdmissionPolicy 'team-a/require-team'" in out

    code, out, _ = run("lint", str(tenant), str(cluster), env={"AP_TENANT_PLUGINS": "Image References"})
    assert code == 2
    assert f"error  {tenant}: AP_TENANT_PLUGINS='Image References': 'Image References' is not a plugin name" in out
    assert f"ok     {cluster}: AdmissionPolicy 'images'" in out   # only tenant policies read it


def test_the_same_tenant_policy_twice_is_an_error_but_a_cluster_policy_of_its_name_is_not(tmp_path: Path) -> None:
    first = write(tmp_path / "a.yaml", tenant_body())
    again = write(tmp_path / "b.yaml", tenant_body(), policy_body("require-team", validations=[NEEDS_TEAM]),
                  tenant_body(namespace="team-b"))
    code, out, _ = run("lint", str(tmp_path))
    assert code == 2
    assert f"error  {again}#1: NamespacedAdmissionPolicy 'team-a/require-team' is also defined in {first}" in out
    assert f"ok     {again}#2: AdmissionPolicy 'require-team'" in out
    assert f"ok     {again}#3: NamespacedAdmissionPolicy 'team-b/require-team'" in out


# --- lint ---------------------------------------------------------------------------------------------

def test_lint_names_a_tenant_policy_and_says_how_it_would_be_bound_as_a_validating_admission_policy() -> None:
    policy = EXAMPLE / "policy.yaml"
    code, out, _ = run("lint", str(EXAMPLE))
    assert code == 0, out
    assert f"ok     {policy}: NamespacedAdmissionPolicy 'team-a/require-team-label'" in out
    assert f"portable      {policy}: NamespacedAdmissionPolicy 'team-a/require-team-label'" in out
    assert (f"note          {policy}: NamespacedAdmissionPolicy 'team-a/require-team-label': metadata.namespace: a "
            "ValidatingAdmissionPolicy is cluster-scoped: its binding judges team-a only with matchResources."
            "namespaceSelector {matchLabels: {kubernetes.io/metadata.name: team-a}}") in out

    code, out, _ = run("lint", "-o", "json", str(EXAMPLE))
    (result,) = json.loads(out)["policies"]
    assert (result["kind"], result["name"], result["ok"]) == ("NamespacedAdmissionPolicy", "team-a/require-team-label",
                                                             True)


def test_a_context_object_of_the_wrong_resource_names_the_tenant_policy(tmp_path: Path) -> None:
    policy = write(tmp_path / "policy.yaml", tenant_body(context=[{"name": "quotas", "version": "v1",
                                                                                "resource": "configmaps"}]))
    objects = write(tmp_path / "secret.yaml", {"apiVersion": "v1", "kind": "Secret",
                                               "metadata": {"name": "s", "namespace": "team-a"}})
    code, _, err = run("test", "-p", str(policy), "--context", f"quotas={objects}", str(objects))
    assert code == 2
    assert "is not what context 'quotas' of NamespacedAdmissionPolicy 'team-a/require-team' lists" in err, err


# --- audit --------------------------------------------------------------------------------------------

def test_audit_judges_the_tenant_namespace_only_and_reports_there(tmp_path: Path) -> None:
    policy = write(tmp_path / "policy.yaml", tenant_body(rules=[rule("pods"), rule("deployments", group="apps")],
                                                        podControllers=[]))
    manifests = write(tmp_path / "objects.yaml", pod(namespace="team-a"), pod(namespace="team-b"),
                      deployment("api", namespace="team-a"))
    code, out, err = run("audit", "-p", str(policy), str(manifests))
    assert code == 1, out + err
    assert "team-a/require-team (Enforce): 2 object(s): 2 fail" in out
    assert "Pod team-a/web" in out and "Deployment team-a/api" in out and "team-b" not in out

    code, out, _ = run("audit", "-p", str(policy), "-o", "json", str(manifests))
    (report,) = json.loads(out)["items"]
    assert (report["kind"], report["metadata"]["namespace"]) == ("Report", "team-a")
    assert {result["policy"] for result in report["results"]} == {"team-a/require-team"}


def test_audit_lists_what_only_tenant_policies_name_in_their_namespaces() -> None:
    """With --kubeconfig: what a cluster policy names cluster-wide, once; what only tenant
    policies name in their namespaces; never a cluster-scoped resource for those."""
    served = [DiscoveredResource("", "v1", "pods"), DiscoveredResource("", "v1", "configmaps"),
              DiscoveredResource("", "v1", "namespaces", namespaced=False)]
    tenants = [compile_policy(api.parse_policy(tenant_body(namespace=namespace, rules=[rule("pods", "namespaces")])))
               for namespace in ("team-b", "team-a")]
    cluster = compile_policy(api.parse_policy(policy_body("p", rules=[rule("configmaps")], validations=[NEEDS_TEAM])))
    scopes = listing_scopes([*tenants, cluster], served)
    assert {key: where for key, (_, where) in scopes.items()} == {
        ("", "pods"): ("team-a", "team-b"), ("", "configmaps"): ("",)}
    cluster = compile_policy(api.parse_policy(policy_body("p", rules=[rule("pods")], validations=[NEEDS_TEAM])))
    assert {key: where for key, (_, where) in listing_scopes([*tenants, cluster], served).items()} == {
        ("", "pods"): ("",)}

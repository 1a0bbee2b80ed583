"""The CRD as the API server takes it: `kubectl apply -f crds/admissionpolicy.yaml` must work (its
CEL rules once named the untyped `value`, and the API server refused the whole file), and each
rule the API server enforces, or leaves to the operator's webhook, answers with a clear message."""
from __future__ import annotations

from typing import Any

import pytest
from e2e_kube import CRD_FILE, ROOT, AdmissionPolicy, Cluster, OperatorProcess, policy_body, unique

from builders import CREATE_POD_RULE

pytestmark = pytest.mark.e2e

CHART_CRD = ROOT / "charts" / "admission-policy-operator" / "crds" / "admissionpolicy.yaml"


@pytest.mark.parametrize("path", [CRD_FILE, CHART_CRD], ids=["crds", "chart"])
def test_kubectl_apply_takes_the_crd(cluster: Cluster, path: Any) -> None:
    # The session applied it server-side already; this is the README's client-side command.
    applied = cluster.kubectl("apply", "-f", str(path))
    assert "customresourcedefinition.apiextensions.k8s.io/admissionpolicies.policy-operator.dev" in applied.stdout
    assert cluster.kubectl("apply", "--dry-run=server", "-f", str(path)).returncode == 0


def patch_policy(name: str, operation: dict[str, Any]) -> dict[str, Any]:
    return policy_body(name, match={"resources": [CREATE_POD_RULE]}, mutations=[{"jsonPatch": [operation]}])


def test_crd_rules_and_the_webhook_refuse_malformed_patch_operations(
        cluster: Cluster, operator: OperatorProcess) -> None:
    # The API server's own CEL rules (typed fields): refused before any webhook is called.
    name = unique("e2e-crd-rule")
    answer = cluster.create(AdmissionPolicy, patch_policy(name, {"op": "remove", "path": "/metadata/labels/x",
                                                                 "valueExpression": "'x'"}), dry_run=True)
    assert answer.status == 422 and "remove, copy and move take no valueExpression" in answer.message, answer
    answer = cluster.create(AdmissionPolicy, policy_body(name, match={"resources": [CREATE_POD_RULE]}), dry_run=True)
    assert answer.status == 422 and "a policy needs at least one validation or mutation" in answer.message, answer

    # `value` is untyped, so the API server's CEL cannot see it: the operator's webhook checks it.
    for operation in ({"op": "add", "path": "/metadata/labels/x"},
                      {"op": "add", "path": "/metadata/labels/x", "value": "v", "valueExpression": "'v'"}):
        answer = cluster.create(AdmissionPolicy, patch_policy(name, operation), dry_run=True)
        assert answer.status == 422, answer
        assert "admission webhook" in answer.message, answer
        assert "spec.mutations[0].jsonPatch[0]" in answer.message, answer
        assert "needs exactly one of value or valueExpression" in answer.message, answer
    answer = cluster.create(AdmissionPolicy, patch_policy(name, {"op": "remove", "path": "/metadata/labels/x",
                                                                 "value": "v"}), dry_run=True)
    assert answer.status == 422 and "takes no value or valueExpression" in answer.message, answer

    # A well-formed one passes both (a literal value that is an object, null, a number: any JSON).
    for value in ({"a": [1, None]}, None, 3):
        answer = cluster.create(AdmissionPolicy, patch_policy(name, {"op": "add", "path": "/metadata/labels/x",
                                                                     "value": value}), dry_run=True)
        assert answer.ok, answer

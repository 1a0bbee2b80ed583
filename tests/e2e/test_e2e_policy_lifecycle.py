"""AdmissionPolicy objects themselves: refused when invalid, and no longer enforced once deleted."""
from __future__ import annotations

from collections.abc import Callable

import pykube
import pytest
from e2e_kube import (
    AdmissionPolicy,
    Cluster,
    MutatingWebhookConfiguration,
    Policies,
    ValidatingWebhookConfiguration,
    assert_denied,
    eventually,
    example_object,
    policy_body,
)
from pykube.exceptions import HTTPError

from builders import CREATE_POD_RULE

pytestmark = pytest.mark.e2e

OFFENSIVE = "deny-offensive-pod-names"


def test_a_policy_whose_cel_does_not_compile_is_refused(cluster: Cluster, policies: Policies) -> None:
    name = "e2e-invalid-cel"
    broken = policy_body(name, match={"resources": [CREATE_POD_RULE]},
                         validations=[{"expression": "object.metadata.name.startsWith(", "message": "never stored"}])
    policies.names.append(name)  # deleted afterwards, should it be stored after all
    # `kubectl apply -f` of a new object is a create.
    with pytest.raises(HTTPError) as error:
        AdmissionPolicy(cluster.api, broken).create()
    message = str(error.value)
    assert error.value.code == 422, message
    assert "admission webhook" in message, message
    assert name in message and "is invalid" in message, message
    assert "spec.validations[0].expression" in message, message
    assert cluster.get(AdmissionPolicy, name).status == 404

    # A broken edit of a good policy is refused too; the good generation stays enforced.
    good = policies.apply(policy_body(
        "e2e-evolving", match={"resources": [CREATE_POD_RULE]},
        validations=[{"expression": "object.metadata.name != 'e2e-reserved'", "message": "the name is reserved"}]))
    edit = cluster.merge_patch(AdmissionPolicy, "e2e-evolving",
                               {"spec": {"validations": [{"expression": "1 + 'x' == 2", "message": "m"}]}})
    assert not edit.ok, f"a policy edit whose CEL does not type-check was stored: {edit}"
    assert edit.status == 422, str(edit)
    assert "admission webhook" in edit.message and "spec.validations[0].expression" in edit.message, str(edit)
    after = cluster.get(AdmissionPolicy, "e2e-evolving").obj
    assert after["metadata"]["generation"] == good["metadata"]["generation"]
    assert after["spec"]["validations"] == good["spec"]["validations"]
    assert after["status"]["phase"] == "Active"


def test_deleting_a_policy_stops_enforcement(cluster: Cluster, policies: Policies,
                                             namespace: Callable[..., str]) -> None:
    ns = namespace()
    pod = example_object(OFFENSIVE, "pod-offensive.yaml", ns, cluster.settings.pod_image)
    policies.apply_example(OFFENSIVE)
    denied = eventually(lambda: cluster.create(pykube.Pod, pod, dry_run=True), lambda a: not a.ok,
                        "the offensive pod to be refused", cluster.settings.timeout)
    assert_denied(denied, OFFENSIVE, "my-offensive-pod")

    policies.delete(OFFENSIVE)  # returns once the object is gone: the operator released the finalizer

    # The finalizer is released only after the policy stopped being enforced and left the
    # webhook configurations, so the very next request is allowed.
    created = cluster.create(pykube.Pod, pod)
    assert created.ok, str(created)
    name = cluster.settings.webhook_config_name
    for cls in (ValidatingWebhookConfiguration, MutatingWebhookConfiguration):
        configuration = cluster.get(cls, name)
        if configuration.status == 404:
            continue
        routed = [rule for webhook in configuration.obj.get("webhooks") or [] for rule in webhook.get("rules") or []
                  if "pods" in rule.get("resources", [])]
        assert routed == [], f"{cls.kind} {name} still routes pods: {routed}"

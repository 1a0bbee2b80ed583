"""The examples' policies through a real API server: denials, messages, warnings and mutations.

Each test applies the example's own ``policy.yaml``, waits until the operator reports it Active,
and creates the example's sample objects (moved to the test's namespace, with a tiny image) the
way kubectl does, checking what the API server answers.
"""
from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import pykube
import pytest
import yaml
from e2e_kube import (
    EXAMPLES,
    EXEMPT_LABEL,
    FINALIZER,
    Answer,
    Cluster,
    Policies,
    assert_denied,
    eventually,
    example_object,
    policy_body,
)
from pykube.exceptions import HTTPError

pytestmark = pytest.mark.e2e

OFFENSIVE = "deny-offensive-pod-names"
LIFESPAN = "lifespan-toleration"
WARN = "require-team-label-warn"
PROD = "prod-min-replicas"


def first_denial(cluster: Cluster, cls: type[Any], body: dict[str, Any]) -> Answer:
    """The first check after a policy went Active: the API server may take a moment to use the new
    webhook configuration, so dry-run (nothing is stored) until the request is refused."""
    return eventually(lambda: cluster.create(cls, body, dry_run=True), lambda a: not a.ok,
                      f"{body['kind']} {body['metadata'].get('name')} to be refused", cluster.settings.timeout)


def test_deny_offensive_pod_names(cluster: Cluster, policies: Policies, namespace: Callable[..., str]) -> None:
    ns = namespace()
    image = cluster.settings.pod_image
    policy = policies.apply_example(OFFENSIVE)
    assert FINALIZER in policy["metadata"]["finalizers"]
    assert {c["type"]: c["status"] for c in policy["status"]["conditions"]}.get("Ready") == "True"

    offensive = example_object(OFFENSIVE, "pod-offensive.yaml", ns, image)
    denied = first_denial(cluster, pykube.Pod, offensive)
    assert_denied(denied, OFFENSIVE, 'pod name "my-offensive-pod" contains "offensive"', code=403)
    assert denied.reason == "Forbidden"

    # As kubectl create/apply sees it: pykube's create() raises the API server's Status as an HTTPError.
    with pytest.raises(HTTPError) as error:
        pykube.Pod(cluster.api, offensive).create()
    assert error.value.code == 403
    assert ('AdmissionPolicy "deny-offensive-pod-names" denied the request: '
            'pod name "my-offensive-pod" contains "offensive"') in str(error.value)
    assert cluster.get(pykube.Pod, "my-offensive-pod", ns).status == 404

    # The API server fills in a generateName's suffix before admission: the policy sees the full name.
    generated = cluster.create(pykube.Pod, example_object(OFFENSIVE, "pod-generatename-offensive.yaml", ns, image))
    assert_denied(generated, OFFENSIVE, code=403)
    assert re.search(r'pod name "offensive-worker-[a-z0-9]{5}" contains "offensive"', generated.message), generated

    nice = cluster.create(pykube.Pod, example_object(OFFENSIVE, "pod-nice.yaml", ns, image))
    assert nice.ok, str(nice)
    assert nice.obj["metadata"]["name"] == "my-nice-pod"
    assert nice.policy_warnings == []

    # The break-glass: a cluster admin's (system:masters) write of a labelled object never reaches the
    # webhook (anyone else's does: test_e2e_break_glass).
    exempt = example_object(OFFENSIVE, "pod-offensive.yaml", ns, image, name="my-offensive-pod-exempt")
    exempt["metadata"].setdefault("labels", {})[EXEMPT_LABEL] = "true"
    allowed = cluster.create(pykube.Pod, exempt)
    assert allowed.ok, str(allowed)


def _lifespan(value: str) -> dict[str, str]:
    return {"key": "acme.com/lifespan-remaining", "operator": "Equal", "value": value, "effect": "NoSchedule"}


def _lifespan_tolerations(pod: dict[str, Any]) -> list[dict[str, Any]]:
    return [t for t in pod["spec"].get("tolerations") or [] if t.get("key") == "acme.com/lifespan-remaining"]


def test_lifespan_toleration_mutates_pods(cluster: Cluster, policies: Policies,
                                          namespace: Callable[..., str]) -> None:
    ns = namespace()
    image = cluster.settings.pod_image
    policies.apply_example(LIFESPAN)

    pod = example_object(LIFESPAN, "pod-lifespan-3.yaml", ns, image)
    eventually(lambda: cluster.create(pykube.Pod, pod, dry_run=True),
               lambda a: a.ok and bool(_lifespan_tolerations(a.obj)),
               "the mutating webhook to add the toleration (dry run)", cluster.settings.timeout)
    created = cluster.create(pykube.Pod, pod)
    assert created.ok, str(created)
    assert _lifespan_tolerations(created.obj) == [_lifespan("14")]
    stored = cluster.get(pykube.Pod, "batch-job", ns)
    assert _lifespan_tolerations(stored.obj) == [_lifespan("14")]

    # Appended after the pod's own tolerations (the API server may add default ones too).
    gpu = cluster.create(pykube.Pod, example_object(LIFESPAN, "pod-lifespan-with-tolerations.yaml", ns, image))
    assert gpu.ok, str(gpu)
    tolerations = gpu.obj["spec"]["tolerations"]
    expected = yaml.safe_load((EXAMPLES / LIFESPAN / "pod-lifespan-with-tolerations-expected.yaml").read_text())
    for toleration in expected["spec"]["tolerations"]:
        assert toleration in tolerations, f"{toleration} missing from {tolerations}"
    assert _lifespan_tolerations(gpu.obj) == [_lifespan("18")]
    nvidia = expected["spec"]["tolerations"][0]
    assert tolerations.index(nvidia) < tolerations.index(_lifespan("18"))

    # Idempotent: a pod that already carries the toleration does not get a second one.
    again = cluster.create(pykube.Pod, example_object(LIFESPAN, "pod-lifespan-3-expected.yaml", ns, image,
                                                      name="batch-job-premutated"))
    assert again.ok, str(again)
    assert _lifespan_tolerations(again.obj) == [_lifespan("14")]

    untouched = cluster.create(pykube.Pod, example_object(LIFESPAN, "pod-no-label.yaml", ns, image))
    assert untouched.ok, str(untouched)
    assert _lifespan_tolerations(untouched.obj) == []

    bad = cluster.create(pykube.Pod, example_object(LIFESPAN, "pod-bad-label.yaml", ns, image))
    assert_denied(bad, LIFESPAN, 'label acme.com/lifespan-requested must be a whole number of days, got "three"',
                  code=422)
    assert cluster.get(pykube.Pod, "batch-job-typo", ns).status == 404


def test_require_team_label_warn_allows_with_warnings(cluster: Cluster, policies: Policies,
                                                      namespace: Callable[..., str]) -> None:
    ns = namespace()
    image = cluster.settings.pod_image
    policies.apply_example(WARN)

    def warning(kind: str, name: str) -> str:
        return f'AdmissionPolicy "{WARN}": {kind} {name} must carry a non-empty team label'

    without = example_object(WARN, "deployment-without-team.yaml", ns, image)
    eventually(lambda: cluster.create(pykube.Deployment, without, dry_run=True), lambda a: bool(a.policy_warnings),
               "a warning for a Deployment without a team label (dry run)", cluster.settings.timeout)
    created = cluster.create(pykube.Deployment, without)
    assert created.ok, str(created)
    assert created.policy_warnings == [warning("Deployment", "checkout")]

    labelled = cluster.create(pykube.Deployment, example_object(WARN, "deployment-with-team.yaml", ns, image,
                                                                name="checkout-labelled"))
    assert labelled.ok, str(labelled)
    assert labelled.policy_warnings == []

    # UPDATE: removing the label is allowed, with the warning.
    removed = cluster.merge_patch(pykube.Deployment, "checkout-labelled", {"metadata": {"labels": {"team": None}}},
                                  namespace=ns)
    assert removed.ok, str(removed)
    assert "team" not in removed.obj["metadata"]["labels"]
    assert removed.policy_warnings == [warning("Deployment", "checkout-labelled")]

    empty = cluster.create(pykube.Deployment, example_object(WARN, "deployment-empty-team.yaml", ns, image,
                                                             name="checkout-empty-team"))
    assert empty.ok, str(empty)
    assert empty.policy_warnings == [warning("Deployment", "checkout-empty-team")]

    statefulset = example_object(WARN, "statefulset-without-labels.yaml", ns, image)
    statefulset["spec"]["replicas"] = 0  # no pods needed; the policy does not look at replicas
    unlabelled = cluster.create(pykube.StatefulSet, statefulset)
    assert unlabelled.ok, str(unlabelled)
    assert unlabelled.policy_warnings == [warning("StatefulSet", "ledger-db")]


def test_prod_min_replicas_only_in_namespaces_labelled_prod(cluster: Cluster, policies: Policies,
                                                            namespace: Callable[..., str]) -> None:
    prod = namespace({"env": "prod"})
    dev = namespace({"env": "dev"})
    image = cluster.settings.pod_image
    policies.apply_example(PROD)

    one = first_denial(cluster, pykube.Deployment, example_object(PROD, "deployment-1.yaml", prod, image))
    assert_denied(one, PROD, "Deployments in prod namespaces need at least 2 replicas, checkout asks for 1",
                  code=403)
    defaulted = cluster.create(pykube.Deployment, example_object(PROD, "deployment-no-replicas.yaml", prod, image,
                                                                 name="checkout-defaulted"))
    assert_denied(defaulted, PROD, "checkout-defaulted asks for 1", code=403)

    in_dev = cluster.create(pykube.Deployment, example_object(PROD, "deployment-1.yaml", dev, image))
    assert in_dev.ok, str(in_dev)

    three = cluster.create(pykube.Deployment, example_object(PROD, "deployment-3.yaml", prod, image))
    assert three.ok, str(three)

    # `kubectl scale deployment checkout --replicas=1` patches the scale subresource.
    scaled = cluster.merge_patch(pykube.Deployment, "checkout", {"spec": {"replicas": 1}}, namespace=prod,
                                 subresource="scale")
    assert_denied(scaled, PROD, "scaling checkout from 3 to 1 replicas is not allowed in prod: keep at least 2",
                  code=403)
    edited = cluster.merge_patch(pykube.Deployment, "checkout", {"spec": {"replicas": 1}}, namespace=prod)
    assert_denied(edited, PROD, "scaling checkout from 3 to 1 replicas is not allowed in prod", code=403)

    to_two = cluster.merge_patch(pykube.Deployment, "checkout", {"spec": {"replicas": 2}}, namespace=prod,
                                 subresource="scale")
    assert to_two.ok, str(to_two)
    assert cluster.get(pykube.Deployment, "checkout", prod).obj["spec"]["replicas"] == 2

    # Outside prod, scaling down is nobody's business.
    dev_scaled = cluster.merge_patch(pykube.Deployment, "checkout", {"spec": {"replicas": 0}}, namespace=dev,
                                     subresource="scale")
    assert dev_scaled.ok, str(dev_scaled)


def test_a_generate_name_is_filled_in_between_mutation_and_validation(
        cluster: Cluster, policies: Policies, namespace: Callable[..., str]) -> None:
    """What the offline CLI models: mutating webhooks see no name on a generateName create, validating
    webhooks see the generated one (the API server names the object after mutating admission)."""
    ns = namespace()
    name = "e2e-generate-name"
    pods = {"apiGroups": [""], "apiVersions": ["v1"], "resources": ["pods"], "operations": ["CREATE"]}
    policies.apply(policy_body(
        name, match={"resources": [pods]},
        mutations=[{"name": "record", "jsonPatch": [{
            "op": "add", "path": "/metadata/labels/e2e-name-at-mutation",
            "valueExpression": "object.metadata.?name.orValue('') == '' ? 'absent' : 'present'"}]}],
        validations=[{"expression": "object.metadata.name.startsWith(object.metadata.generateName)",
                      "message": "the validating webhook saw no generated name"}]))
    pod = {"apiVersion": "v1", "kind": "Pod",
           "metadata": {"generateName": "worker-", "namespace": ns, "labels": {"app": "e2e"}},
           "spec": {"containers": [{"name": "c", "image": cluster.settings.pod_image}]}}
    created = eventually(lambda: cluster.create(pykube.Pod, pod, dry_run=True),
                         lambda a: a.ok and "e2e-name-at-mutation" in a.obj["metadata"]["labels"],
                         "the generateName pod to be mutated", cluster.settings.timeout)
    assert created.obj["metadata"]["labels"]["e2e-name-at-mutation"] == "absent"
    assert re.fullmatch(r"worker-[a-z0-9]{5}", created.obj["metadata"]["name"]), created

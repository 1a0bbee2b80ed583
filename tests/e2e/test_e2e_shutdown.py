"""When the operator is gone, what it registered must not lock up kube-system or its own namespace.

The test stops the session's operator while a policy routes ConfigMaps to both webhook
configurations (failurePolicy Fail), checks writes, removes the configurations with the
``admission-policy cleanup-webhooks`` CLI, and starts the operator again (its teardown needs it).
"""
from __future__ import annotations

import os
import subprocess
from collections.abc import Callable
from typing import Any

import pykube
import pytest
from e2e_kube import (
    EXEMPT_LABEL,
    GUARD,
    GUARDED,
    MUTATED,
    Cluster,
    MutatingWebhookConfiguration,
    OperatorProcess,
    Policies,
    ValidatingWebhookConfiguration,
    assert_denied,
    cli,
    configmap,
    eventually,
    guard_policy,
    unique,
)

pytestmark = pytest.mark.e2e

def routes(cluster: Cluster, cls: type[Any], resource: str) -> bool:
    configuration = cluster.get(cls, cluster.settings.webhook_config_name)
    if configuration.status == 404:
        return False
    return any(resource in rule.get("resources", [])
               for webhook in configuration.obj.get("webhooks") or [] for rule in webhook.get("rules") or [])


def test_after_the_operator_exits_kube_system_and_its_namespace_stay_writable(
        cluster: Cluster, operator: OperatorProcess, policies: Policies, namespace: Callable[..., str]) -> None:
    ns = namespace()
    own = cluster.settings.operator_namespace
    guarded = {GUARDED: "true"}
    timeout = cluster.settings.timeout
    policies.apply(guard_policy())

    # Running: enforced and mutating in an ordinary namespace ...
    denied = eventually(lambda: cluster.create(pykube.ConfigMap, configmap(ns, "forbidden-probe", guarded),
                                               dry_run=True),
                        lambda a: not a.ok, "a guarded forbidden- ConfigMap to be refused", timeout)
    assert_denied(denied, GUARD, "configmap names must not start with forbidden-", code=403)
    marked = cluster.create(pykube.ConfigMap, configmap(ns, "guarded", guarded))
    assert marked.ok, str(marked)
    assert marked.obj["metadata"]["labels"].get(MUTATED) == "true"
    assert routes(cluster, ValidatingWebhookConfiguration, "configmaps")
    assert routes(cluster, MutatingWebhookConfiguration, "configmaps")

    created: list[tuple[str, str]] = []
    try:
        # ... and never in kube-system or in the operator's own namespace.
        for exempt_namespace in ("kube-system", own):
            name = unique("forbidden-e2e-running")
            created.append((exempt_namespace, name))
            answer = cluster.create(pykube.ConfigMap, configmap(exempt_namespace, name, guarded))
            assert answer.ok, f"a write in {exempt_namespace} reached the policy: {answer}"
            assert MUTATED not in answer.obj["metadata"]["labels"], f"mutated in {exempt_namespace}"

        operator.stop()
        assert not operator.alive()

        # The configurations outlive the operator (replicas share them; uninstall removes them).
        # If they still route ConfigMaps, they fail closed in ordinary namespaces ...
        if routes(cluster, ValidatingWebhookConfiguration, "configmaps") or \
                routes(cluster, MutatingWebhookConfiguration, "configmaps"):
            blocked = cluster.create(pykube.ConfigMap, configmap(ns, "while-down"), dry_run=True)
            assert not blocked.ok and "failed calling webhook" in blocked.message, (
                f"expected the dead webhook to refuse a write in {ns}: {blocked}")

        # ... but never in kube-system or the operator's namespace: create, update, delete all pass.
        for exempt_namespace in ("kube-system", own):
            for labels in ({}, guarded):
                name = unique("forbidden-e2e-down")
                created.append((exempt_namespace, name))
                answer = cluster.create(pykube.ConfigMap, configmap(exempt_namespace, name, labels))
                assert answer.ok, f"operator down: a create in {exempt_namespace} was blocked: {answer}"
                answer = cluster.merge_patch(pykube.ConfigMap, name, {"data": {"updated": "yes"}},
                                             namespace=exempt_namespace)
                assert answer.ok, f"operator down: an update in {exempt_namespace} was blocked: {answer}"
                answer = cluster.delete(pykube.ConfigMap, name, exempt_namespace)
                assert answer.ok, f"operator down: a delete in {exempt_namespace} was blocked: {answer}"
        # Nor for a cluster admin's break-glass writes (objects labelled exempt), anywhere.
        exempt = cluster.create(pykube.ConfigMap, configmap(ns, "exempt-while-down", {EXEMPT_LABEL: "true"}))
        assert exempt.ok, f"operator down: an exempt-labelled write was blocked: {exempt}"

        # Uninstall: the CLI deletes both configurations; then nothing blocks anywhere.
        config_name = cluster.settings.webhook_config_name
        env = {**os.environ, "KUBECONFIG": str(cluster.settings.kubeconfig)}
        result = subprocess.run([*cli(), "cleanup-webhooks", "--name", config_name], capture_output=True,
                                text=True, timeout=120, env=env)
        assert result.returncode == 0, f"cleanup-webhooks failed:\n{result.stdout}{result.stderr}"
        assert cluster.get(ValidatingWebhookConfiguration, config_name).status == 404
        assert cluster.get(MutatingWebhookConfiguration, config_name).status == 404
        eventually(lambda: cluster.create(pykube.ConfigMap, configmap(ns, "after-cleanup"), dry_run=True),
                   lambda a: a.ok, f"writes in {ns} to pass once the configurations are gone", timeout)
    finally:
        for exempt_namespace, name in created:
            cluster.delete(pykube.ConfigMap, name, exempt_namespace)
        if not operator.alive():
            operator.start()  # waits until ready and the API server reaches it again

    # Restarted, it writes its configurations again and enforces the policy it still has.
    policies.wait_active(GUARD)
    denied = eventually(lambda: cluster.create(pykube.ConfigMap, configmap(ns, "forbidden-again", guarded),
                                               dry_run=True),
                        lambda a: not a.ok, "the guard to be enforced again after the restart", timeout)
    assert_denied(denied, GUARD, "configmap names must not start with forbidden-", code=403)

"""A policy's life as a user sees it with kubectl: apply, `get -w`, `describe`, a broken edit,
and a policy that slipped in while the webhook was down going Failed, then fixed.

Every step is a kubectl command line against the real API server, and the assertions read what
kubectl prints, because that is what a user reads.
"""
from __future__ import annotations

import os
import re
import subprocess
from typing import Any

import pytest
import yaml
from e2e_kube import (
    OWNED_LABEL,
    AdmissionPolicy,
    Answer,
    Cluster,
    MutatingWebhookConfiguration,
    OperatorProcess,
    Policies,
    ValidatingWebhookConfiguration,
    eventually,
    policy_body,
    unique,
)

from builders import CREATE_POD_RULE

pytestmark = pytest.mark.e2e

GOOD = {"expression": "object.metadata.name != 'e2e-reserved'", "message": "the name e2e-reserved is reserved"}
BROKEN = {"expression": "object.metadata.name.startsWith(", "message": "never compiles"}


def manifest(name: str, validation: dict[str, str], **labels: str) -> str:
    body = policy_body(name, enforcement="Enforce", match={"resources": [CREATE_POD_RULE]}, validations=[validation])
    body["metadata"]["labels"].update(labels)
    return yaml.safe_dump(body)


def table(output: str) -> list[dict[str, str]]:
    """`kubectl get` output as rows keyed by the header's column names."""
    lines = [line for line in output.splitlines() if line.strip()]
    header = lines[0].split()
    return [dict(zip(header, re.split(r"\s{2,}", line.strip()), strict=False)) for line in lines[1:]]


def describe_section(text: str, heading: str) -> str:
    """The lines of one top-level `kubectl describe` section (``Status:``, ``Events:``)."""
    match = re.search(rf"^{heading}:(.*?)(?=^\S|\Z)", text, re.MULTILINE | re.DOTALL)
    assert match, f"no {heading!r} section in:\n{text}"
    return match.group(1)


def test_apply_watch_and_describe(cluster: Cluster, policies: Policies) -> None:
    name = unique("e2e-kubectl")
    selector = unique("watch")
    watch = subprocess.Popen([cluster.settings.kubectl, "get", "ap", "-w", "-l", f"e2e-watch={selector}"],
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                             env={**os.environ, "KUBECONFIG": str(cluster.settings.kubeconfig)})
    try:
        # `kubectl get -w` prints nothing until the first object: wait until its watch is open.
        cluster.kubectl("get", "ap", "-l", f"e2e-watch={selector}")
        policies.names.append(name)
        applied = cluster.kubectl("apply", "-f", "-", input=manifest(name, GOOD, **{"e2e-watch": selector}))
        assert f"admissionpolicy.policy-operator.dev/{name} created" in applied.stdout
        policies.wait_active(name)
    finally:
        watch.terminate()
        watched, _ = watch.communicate(timeout=10)

    # -w: one line per change; the phase goes Pending, then Active.
    phases = [row.get("PHASE", "") for row in table(watched) if row.get("NAME") == name]
    assert "Active" in phases, watched
    assert "Pending" in phases[: phases.index("Active")], f"no Pending before Active:\n{watched}"

    listed = cluster.kubectl("get", "ap", name).stdout
    # VIOLATIONS stays empty until a background scan (off in the session's operator: test_e2e_audit.py).
    assert listed.splitlines()[0].split() == ["NAME", "ENFORCEMENT", "PHASE", "ENFORCED-BY", "VIOLATIONS", "AGE"]
    rows = table(listed)
    assert rows[0]["NAME"] == name and rows[0]["ENFORCEMENT"] == "Enforce" and rows[0]["PHASE"] == "Active"
    assert cluster.kubectl("get", "admpol", name, "-o", "name").stdout.strip() == \
        f"admissionpolicy.policy-operator.dev/{name}"

    # describe: the conditions of this generation, and the transition's event (posted where
    # kubectl looks for a cluster-scoped object's events: this failed before, `Events: <none>`).
    def described() -> str:
        return cluster.kubectl("describe", "ap", name).stdout
    text = eventually(described, lambda t: "<none>" not in describe_section(t, "Events"),
                      f"events of {name} in kubectl describe", cluster.settings.timeout)
    status = describe_section(text, "Status")
    for condition in ("Compiled", "Registered", "Ready", "TypeChecked"):
        assert re.search(rf"Status:\s+True\s+Type:\s+{condition}\b", status), status
    # Each condition, and the status; Native too once native enforcement has looked at the policy.
    assert len(re.findall(r"Observed Generation:\s+1\n", status)) in (5, 6), status
    events = describe_section(text, "Events")
    assert re.search(r"Normal\s+Active\s+.*admission-policy-operator\s+\(new\) → Active", events), events


def test_a_broken_edit_is_refused_and_a_policy_that_slipped_in_goes_failed_until_fixed(
        cluster: Cluster, operator: OperatorProcess, policies: Policies) -> None:
    name = unique("e2e-slipped-in")
    policies.names.append(name)

    # With the operator up, broken CEL never gets stored: kubectl apply prints the field and column.
    refused = cluster.kubectl("apply", "-f", "-", input=manifest(name, BROKEN), check=False)
    assert refused.returncode != 0
    assert "denied the request" in refused.stderr and "spec.validations[0].expression (line 1, column" in \
        refused.stderr, refused.stderr
    assert cluster.get(AdmissionPolicy, name).status == 404

    # Down, and its configurations removed (an uninstall half-done): now the API server stores it.
    operator.stop()
    try:
        cluster.delete_webhook_configurations()
        eventually(lambda: cluster.create(AdmissionPolicy, yaml.safe_load(manifest(name, BROKEN))),
                   lambda a: a.ok, f"AdmissionPolicy {name} to be stored with no webhook", cluster.settings.timeout)
    finally:
        operator.start()

    def phase_of(answer: Answer) -> Any:
        return (answer.obj.get("status") or {}).get("phase") if answer.ok else None
    eventually(lambda: cluster.get(AdmissionPolicy, name), lambda a: phase_of(a) == "Failed",
               f"AdmissionPolicy {name} to go Failed", cluster.settings.timeout)
    assert table(cluster.kubectl("get", "ap", name).stdout)[0]["PHASE"] == "Failed"
    text = eventually(lambda: cluster.kubectl("describe", "ap", name).stdout,
                      lambda t: "Failed" in describe_section(t, "Events"),
                      f"the Failed event of {name}", cluster.settings.timeout)
    status = describe_section(text, "Status")
    assert "CompileError" in status and "spec.validations[0].expression (line 1, column" in status, status
    assert re.search(r"Warning\s+Failed\s+.*→ Failed", describe_section(text, "Events")), text

    # Metadata-only edits never need the webhook to approve the (still broken) spec.
    cluster.kubectl("label", "ap", name, f"{OWNED_LABEL}-note=failed")

    # Fixed with a new generation: Pending, then Active, enforced.
    cluster.kubectl("apply", "-f", "-", input=manifest(name, GOOD))
    fixed = policies.wait_active(name)
    assert fixed["metadata"]["generation"] == 2
    conditions = {c["type"]: c for c in fixed["status"]["conditions"]}
    assert conditions["Compiled"]["status"] == "True" and conditions["Compiled"]["observedGeneration"] == 2


@pytest.mark.parametrize(("name", "path"), [
    ("policies.validate.policy-operator.dev", "/validate-policy"),
    ("tenant-policies.validate.policy-operator.dev", "/validate-tenant-policy"),
])
def test_the_webhook_configuration_names_the_operator_for_policies_only_where_a_spec_is_written(
        cluster: Cluster, operator: OperatorProcess, name: str, path: str) -> None:
    """The fixed entries as the API server stored them (matchConditions are beta in 1.28: not dropped)."""
    configuration = cluster.get(ValidatingWebhookConfiguration, cluster.settings.webhook_config_name).obj
    (entry,) = [w for w in configuration["webhooks"] if w["name"] == name]
    assert [c["name"] for c in entry.get("matchConditions") or []] == ["spec-written"], entry
    assert entry["clientConfig"]["url"] == f"{operator.url}{path}"


@pytest.mark.parametrize(("kind", "name", "path"), [
    (ValidatingWebhookConfiguration, "exceptions.validate.policy-operator.dev", "/validate-exception"),
    (MutatingWebhookConfiguration, "exceptions.mutate.policy-operator.dev", "/mutate-exception"),
])
def test_the_webhook_configurations_name_the_operator_for_exceptions_where_their_record_or_spec_is_written(
        cluster: Cluster, operator: OperatorProcess, kind: type[Any], name: str, path: str) -> None:
    """The fixed entries as the API server stored them: it compiled their matchCondition in its own
    CEL environment, and no selector lets an exempt namespace or label skip an exception's review."""
    configuration = cluster.get(kind, cluster.settings.webhook_config_name).obj
    (entry,) = [w for w in configuration["webhooks"] if w["name"] == name]
    assert [c["name"] for c in entry.get("matchConditions") or []] == ["record-or-spec-written"], entry
    assert entry["clientConfig"]["url"] == f"{operator.url}{path}"
    assert entry["failurePolicy"] == "Fail"
    assert entry["rules"] == [{"apiGroups": ["policy-operator.dev"], "apiVersions": ["v1alpha1"],
                               "operations": ["CREATE", "UPDATE"], "resources": ["admissionpolicyexceptions"],
                               "scope": "Namespaced"}]
    assert entry.get("namespaceSelector") in (None, {}) and entry.get("objectSelector") in (None, {}), entry

"""The background audit loop with Kopf running against the emulator (the e2e test covers the real API server)."""
from __future__ import annotations

import asyncio
import functools
import pathlib
from typing import Any

import kmock
import pytest
import yaml
from emulator import ADMISSION_POLICIES, CONFIGMAPS, Emulator, wait_for
from operator_env import (
    NAMESPACE,
    operator_environment,
    operator_running,
    pod_request,
    wait_phase,
    webhook_client,
)

import builders
from admission_policy import reports
from builders import CREATE_POD_RULE, policy_body

REPORT_CRDS = pathlib.Path(__file__).parents[2] / "charts" / "admission-policy-operator" / "files" / \
    "openreports-crds.yaml"
REPORTS = f"{reports.API_VERSION}/{reports.REPORTS}"
CONFIGMAP_RULE = {"apiGroups": [""], "apiVersions": ["v1"], "resources": ["configmaps"],
                  "operations": ["CREATE", "UPDATE"]}
TEAM = [{"expression": "has(object.metadata.labels) && 'team' in object.metadata.labels",
         "message": "a team label is required"}]


@pytest.fixture
def env(monkeypatch: pytest.MonkeyPatch, tmp_path: pathlib.Path) -> dict[str, str]:
    env = operator_environment(monkeypatch, tmp_path / "certs")
    monkeypatch.setenv("AP_AUDIT_INTERVAL", "1")
    return env


configmap = functools.partial(builders.configmap, namespace="apps")   # where the audited objects are


def audit_status(emulator: Emulator, name: str) -> dict[str, Any]:
    return dict(((emulator.peek(ADMISSION_POLICIES, name) or {}).get("status") or {}).get("audit") or {})


async def test_existing_objects_are_scanned_into_status_and_one_report_written_once(
        emulator: Emulator, run_operator: Any, env: dict[str, str]) -> None:
    for crd in yaml.safe_load_all(REPORT_CRDS.read_text()):
        emulator.declare_crd(crd)
    emulator.kmock.put_object(CONFIGMAPS, configmap("bad"))
    emulator.kmock.put_object(CONFIGMAPS, configmap("good", labels={"team": "a"}))
    # Judged too: the break-glass label lets named identities write past the webhooks, and the
    # reports are where such an object shows.
    emulator.kmock.put_object(CONFIGMAPS, configmap("glass", labels={"policy-operator.dev/exempt": "true"}))
    emulator.kmock.put_object(CONFIGMAPS, configmap("ours", namespace=NAMESPACE))   # the operator's namespace
    async with operator_running(run_operator):
        await emulator.create(ADMISSION_POLICIES, policy_body(
            "team", enforcement="Audit", match={"resources": [CONFIGMAP_RULE]}, validations=TEAM))
        await wait_phase(emulator, "team", "Active")
        await wait_for(lambda: audit_status(emulator, "team").get("violations") == 2, timeout=20)
        status = audit_status(emulator, "team")
        assert status["objectsScanned"] == 3 and status["scannedGeneration"] == 1, status
        bad, glass = sorted(status["firstViolations"], key=lambda v: str(v["name"]))
        assert bad == {"apiVersion": "v1", "kind": "ConfigMap", "namespace": "apps", "name": "bad",
                       "uid": bad["uid"], "message": "a team label is required"}
        assert glass["name"] == "glass"
        await wait_for(lambda: emulator.peek(REPORTS, reports.NAME, namespace="apps") is not None, timeout=20)
        report = emulator.peek(REPORTS, reports.NAME, namespace="apps")
        assert report is not None
        assert report["summary"]["fail"] == 2 and report["summary"]["pass"] == 1
        assert emulator.peek(REPORTS, reports.NAME, namespace=NAMESPACE) is None

        # Idle: scans go on (status.audit is rewritten), the report is not.
        written = report["metadata"]["resourceVersion"]
        scanned = status["lastScanTime"]
        await wait_for(lambda: audit_status(emulator, "team").get("lastScanTime") != scanned, timeout=20)
        await asyncio.sleep(2.5)
        again = emulator.peek(REPORTS, reports.NAME, namespace="apps")
        assert again is not None and again["metadata"]["resourceVersion"] == written

        # A new generation is rescanned at once, and its results replace the old ones.
        await emulator.patch(ADMISSION_POLICIES, "team", {"spec": {"validations": [
            {"expression": "object.metadata.name != 'good'", "message": "not good"}]}})
        await wait_for(lambda: audit_status(emulator, "team").get("scannedGeneration") == 2, timeout=20)
        assert [v["name"] for v in audit_status(emulator, "team")["firstViolations"]] == ["good"]
        await wait_for(lambda: [r["resources"][0]["name"] for r in (emulator.peek(
            REPORTS, reports.NAME, namespace="apps") or {}).get("results", []) if r["result"] == "fail"] == ["good"],
            timeout=20)

        # A deleted policy's report goes.
        await emulator.delete(ADMISSION_POLICIES, "team")
        await wait_for(lambda: emulator.peek(ADMISSION_POLICIES, "team") is None, timeout=20)
        await wait_for(lambda: emulator.peek(REPORTS, reports.NAME, namespace="apps") is None, timeout=20)


async def test_a_restarted_operator_rewrites_no_report_that_did_not_change(
        emulator: Emulator, run_operator: Any, env: dict[str, str]) -> None:
    """Each result keeps the time it was first seen across a restart (read back from the report):
    a restart used to rewrite every report, the timestamps being the new scan's."""
    for crd in yaml.safe_load_all(REPORT_CRDS.read_text()):
        emulator.declare_crd(crd)
    emulator.kmock.put_object(CONFIGMAPS, configmap("bad"))
    async with operator_running(run_operator):
        await emulator.create(ADMISSION_POLICIES, policy_body(
            "team", enforcement="Audit", match={"resources": [CONFIGMAP_RULE]}, validations=TEAM))
        await wait_for(lambda: emulator.peek(REPORTS, reports.NAME, namespace="apps") is not None, timeout=20)
    report = emulator.peek(REPORTS, reports.NAME, namespace="apps")
    assert report is not None
    scanned = audit_status(emulator, "team")["lastScanTime"]
    await asyncio.sleep(1.1)   # a new scan's own timestamps would differ
    async with operator_running(run_operator):
        await wait_for(lambda: audit_status(emulator, "team").get("lastScanTime") != scanned, timeout=20)
        await asyncio.sleep(2.5)   # the round's writes are done
        again = emulator.peek(REPORTS, reports.NAME, namespace="apps")
        assert again is not None and again["metadata"]["resourceVersion"] == report["metadata"]["resourceVersion"]
        await emulator.delete(ADMISSION_POLICIES, "team")
        await wait_for(lambda: emulator.peek(ADMISSION_POLICIES, "team") is None, timeout=20)


async def test_without_the_report_crds_only_the_status_is_written(
        emulator: Emulator, run_operator: Any, env: dict[str, str]) -> None:
    emulator.kmock.put_object(CONFIGMAPS, configmap("bad"))
    async with operator_running(run_operator):
        await emulator.create(ADMISSION_POLICIES, policy_body(
            "team", enforcement="Warn", match={"resources": [CONFIGMAP_RULE]}, validations=TEAM))
        await wait_for(lambda: audit_status(emulator, "team").get("violations") == 1, timeout=20)
    ours = {kmock.resource(REPORTS), kmock.resource(f"{reports.API_VERSION}/{reports.CLUSTER_REPORTS}")}
    assert [r for r in emulator.kmock if r.resource in ours] == []
    assert any(r.resource == kmock.resource(CONFIGMAPS) for r in emulator.kmock)   # it did list


async def test_a_report_admission_policy_reports_a_warn_failure_at_once(
        emulator: Emulator, run_operator: Any, env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> None:
    """spec.reportAdmission: a Warn failure served by the reconciling replica is in the report
    before any scan could have seen the object (the interval is an hour); a dry run is not."""
    monkeypatch.setenv("AP_AUDIT_INTERVAL", "1h")
    for crd in yaml.safe_load_all(REPORT_CRDS.read_text()):
        emulator.declare_crd(crd)
    async with operator_running(run_operator):
        await emulator.create(ADMISSION_POLICIES, policy_body(
            "team-warn", enforcement="Warn", reportAdmission=True, match={"resources": [CREATE_POD_RULE]},
            validations=[{"expression": "has(object.metadata.labels) && 'team' in object.metadata.labels",
                          "message": "pods need a team"}]))
        await wait_phase(emulator, "team-warn", "Active")
        await wait_for(lambda: "scannedGeneration" in audit_status(emulator, "team-warn"), timeout=20)
        webhook = webhook_client(emulator, env)
        dry = pod_request("dry-run", uid="b0c1a2d3-0000-4000-8000-000000000002")
        dry["dryRun"] = True
        for request in (dry, pod_request("no-team")):
            response = await webhook.review("/validate", request)
            assert response["allowed"] and response["warnings"], response

        def admitted() -> list[dict[str, Any]]:
            report = emulator.peek(REPORTS, reports.NAME, namespace="default") or {}
            return [r for r in report.get("results", []) if r["properties"]["origin"] == "admission"]
        await wait_for(lambda: admitted(), timeout=20)
        (result,) = admitted()
        assert (result["result"], result["policy"], result["message"]) == ("warn", "team-warn", "pods need a team")
        assert result["resources"][0]["name"] == "no-team" and result["rule"] == "spec.validations[0]"

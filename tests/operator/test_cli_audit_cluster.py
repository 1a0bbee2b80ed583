"""``admission-policy audit --kubeconfig`` against the emulator where RBAC refuses one resource.

The e2e suite audits a real cluster (tests/e2e/test_e2e_audit.py); here kmock answers 403 to
listing ConfigMaps, as an API server does for an account without that permission.
"""
from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import kmock
import pytest
import yaml
from click.testing import CliRunner
from emulator import CONFIGMAPS, NAMESPACES, SECRETS, Emulator

from admission_policy.cli import main
from builders import policy_body, rule

FORBIDDEN = {"kind": "Status", "apiVersion": "v1", "status": "Failure", "code": 403, "reason": "Forbidden",
             "message": 'configmaps is forbidden: User "ci" cannot list resource "configmaps"'}


def policy(path: Path, enforcement: str) -> Path:
    path.write_text(yaml.safe_dump(policy_body(
        "team-label", rules=[rule("configmaps", "secrets")], enforcement=enforcement,
        match={"namespaceSelector": {"matchLabels": {"audited": "yes"}}},
        validations=[{"expression": "has(object.metadata.labels) && 'team' in object.metadata.labels",
                      "message": "a team label is required"}])))
    return path


async def audit(*args: str) -> tuple[int, str, str]:
    """The CLI in a thread: it runs its own event loop, and the emulator serves from this one."""
    result: Any = await asyncio.to_thread(CliRunner().invoke, main, ["audit", *args, "--progress", "never"])
    return result.exit_code, result.stdout, result.stderr


@pytest.mark.parametrize(("enforcement", "exit_code"), [("Enforce", 1), ("Audit", 3)])
async def test_a_resource_that_cannot_be_listed_is_named_and_the_rest_audited(
        emulator: Emulator, tmp_path: Path, enforcement: str, exit_code: int) -> None:
    """As the operator's scan: a 403 on ConfigMaps leaves the Secrets judged. Exit 3 says the audit is
    incomplete; an Enforce violation found among the rest still exits 1."""
    await emulator.create(NAMESPACES, {"apiVersion": "v1", "kind": "Namespace",
                                       "metadata": {"name": "apps", "labels": {"audited": "yes"}}})
    await emulator.create(SECRETS, {"apiVersion": "v1", "kind": "Secret",
                                    "metadata": {"name": "unlabelled", "namespace": "apps"}})
    await emulator.create(CONFIGMAPS, {"apiVersion": "v1", "kind": "ConfigMap",
                                       "metadata": {"name": "unseen", "namespace": "apps"}})
    emulator.kmock["list", kmock.resource(CONFIGMAPS)] << 403 << FORBIDDEN
    path = str(policy(tmp_path / "policy.yaml", enforcement))
    kubeconfig = str(emulator.kubeconfig)

    code, out, err = await audit("-p", path, "--kubeconfig", kubeconfig)
    assert code == exit_code, out + err
    assert err == ('warning: cannot list configmaps: 403 configmaps is forbidden: User "ci" cannot list resource '
                   '"configmaps": its objects are not audited\n')
    assert f"team-label ({enforcement}): 1 object(s): 1 fail" in out, out
    assert "Secret apps/unlabelled" in out and "unseen" not in out
    assert "1 resource(s) could not be listed" in out

    code, out, err = await audit("-p", path, "--kubeconfig", kubeconfig, "-o", "json")
    assert code == exit_code and "cannot list configmaps: 403" in err
    (report,) = json.loads(out)["items"]
    assert [r["resources"][0]["name"] for r in report["results"]] == ["unlabelled"]

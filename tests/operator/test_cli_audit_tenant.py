"""``admission-policy audit --kubeconfig`` with NamespacedAdmissionPolicies, as a namespace's admin.

The admin of team-a may list Pods and read its Namespace in team-a only: the API server answers
403 to listing Pods or Namespaces cluster-wide. The tenant policy judges team-a's objects only,
so the audit lists there, as the operator's scan does, and succeeds with that identity.
"""
from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import kmock
import yaml
from click.testing import CliRunner
from emulator import NAMESPACES, PODS, Emulator

from admission_policy import api
from admission_policy.cli import main
from builders import pod, policy_body

FORBIDDEN = {"kind": "Status", "apiVersion": "v1", "status": "Failure", "code": 403, "reason": "Forbidden",
             "message": 'User "team-a-admin" cannot list resource at the cluster scope'}


def tenant_policy(path: Path) -> Path:
    body = policy_body("require-team", metadata={"namespace": "team-a"},
                       validations=[{"expression": "has(object.metadata.labels) && 'team' in object.metadata.labels",
                                     "message": "a team label is required"}])
    path.write_text(yaml.safe_dump({**body, "kind": api.NAMESPACED_KIND}))
    return path


async def audit(*args: str) -> tuple[int, str, str]:
    """The CLI in a thread: it runs its own event loop, and the emulator serves from this one."""
    result: Any = await asyncio.to_thread(CliRunner().invoke, main, ["audit", *args, "--progress", "never"])
    return result.exit_code, result.stdout, result.stderr


async def test_a_tenant_policy_is_audited_in_its_own_namespace_with_a_namespace_admins_rights(
        emulator: Emulator, tmp_path: Path) -> None:
    for name in ("team-a", "team-b"):
        await emulator.create(NAMESPACES, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})
        await emulator.create(PODS, pod("unlabelled", namespace=name))
    emulator.kmock["list", kmock.resource(PODS), kmock.namespace(None)] << 403 << FORBIDDEN
    emulator.kmock["list", kmock.resource(NAMESPACES)] << 403 << FORBIDDEN

    code, out, err = await audit("-p", str(tenant_policy(tmp_path / "policy.yaml")),
                                 "--kubeconfig", str(emulator.kubeconfig))
    assert code == 1, out + err
    assert "team-a/require-team (Enforce): 1 object(s): 1 fail" in out
    assert "Pod team-a/unlabelled" in out and "team-b" not in out
    assert err == ""

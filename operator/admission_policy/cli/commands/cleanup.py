"""``admission-policy cleanup``: what ``helm uninstall`` runs; the operator's webhook configurations
and every Validating- and MutatingAdmissionPolicy and binding generated for native enforcement
(``cli/uninstall.py``)."""
from __future__ import annotations

import json
from typing import Any

import click

from ..output import fail
from .cleanup_webhooks import name_option


@click.command("cleanup")
@name_option
def cleanup_command(name: str) -> None:
    """Uninstall cleanup: delete what the operator created at runtime. Absent objects are fine.

    \b
    - both webhook configurations named --name (as `cleanup-webhooks`);
    - every Validating- and MutatingAdmissionPolicy and binding generated for native
      enforcement (labelled app.kubernetes.io/managed-by=admission-policy-operator), at the
      versions the cluster serves: its finalizer released, bindings before policies. They carry
      nothing of a Helm release (every release in a cluster generates them from the same
      policies), so all of them go: an operator of another release still running writes them
      back, after a few seconds in which those policies go unenforced.

    Prints what it deleted. Exit 2, naming what could not be deleted, when anything could not.
    The chart's uninstall hook runs it. Without --name, the name `admission-policy run` uses:
    AP_WEBHOOK_CONFIG_NAME, else the default; list them with:

    \b
      kubectl get validatingwebhookconfigurations -l app.kubernetes.io/managed-by=admission-policy-operator
    """
    import asyncio

    from ...cluster.client import call_json, new_api_client
    from ..uninstall import Removal, remove_configurations, remove_generated

    async def remove() -> tuple[list[str] | None, Removal | None, list[str]]:
        webhooks: list[str] | None = None   # None: could not be deleted (a problem says why)
        problems: list[str] = []
        api_client = await new_api_client()
        async with api_client:
            try:
                webhooks = [f"{kind} {name}" for kind in await remove_configurations(api_client, name)]
            except Exception as exc:   # the generated objects are still worth removing
                problems.append(f"the webhook configurations {name!r} ({_one_line(exc)})")

            async def call(method: str, path: str, **options: Any) -> tuple[int, Any]:
                return await call_json(api_client, method, path, **options)

            removal = None
            try:
                removal = await remove_generated(call)
            except RuntimeError as exc:
                problems.append(f"the generated ValidatingAdmissionPolicies ({exc})")
            return webhooks, removal, problems

    try:
        webhooks, removal, problems = asyncio.run(remove())
    except Exception as exc:
        fail(RuntimeError(f"cannot clean up: {_one_line(exc)}"))
    if webhooks is not None:
        for what in webhooks:
            click.echo(f"deleted {what}")
        if not webhooks:
            click.echo(f"no webhook configurations named {name!r}")
    if removal is not None:
        for what in removal.deleted:
            click.echo(f"deleted {what}")
        for what in removal.terminating:
            click.echo(f"deleted {what}: terminating until those release it")
        if removal.version is None:
            click.echo("no ValidatingAdmissionPolicy API served: nothing generated to delete")
        elif not removal.deleted and not removal.terminating and not removal.failed:
            click.echo("no generated admission policies or bindings")
        problems += removal.failed
    if problems:
        fail(RuntimeError("cannot delete " + "; ".join(" ".join(p.split()) for p in problems)))


def _one_line(exc: Exception) -> str:
    """An ApiException's status and the API server's message (its text spans the response's headers)."""
    status = getattr(exc, "status", None)
    if status is None:
        return " ".join(str(exc).split()) or type(exc).__name__
    try:
        message = str(json.loads(getattr(exc, "body", None) or "{}").get("message") or "")
    except (ValueError, AttributeError):
        message = ""
    return f"{status}: {message or getattr(exc, 'reason', '')}"

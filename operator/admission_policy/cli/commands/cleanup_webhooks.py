"""``admission-policy cleanup-webhooks``: delete the operator's webhook configurations, and only them."""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

import click

from ...config import SETTINGS, OperatorConfig
from ..output import fail

# What `run` names them, so that no --name finds what it wrote: the same variable and default.
_NAME = SETTINGS["webhook_config_name"].env

name_option: Callable[[Callable[..., Any]], Callable[..., Any]] = click.option(
    "--name", envvar=_NAME, default=OperatorConfig.webhook_config_name, show_default=True,
    help=f"Name of both webhook configurations [env {_NAME}].")


@click.command("cleanup-webhooks")
@name_option
def cleanup_webhooks_command(name: str) -> None:
    """Delete the operator's webhook configurations. Absent ones are fine.

    Only them: the ValidatingAdmissionPolicies generated for native enforcement stay, and go on
    enforcing while the operator is down. To uninstall, `admission-policy cleanup` deletes both.

    Without --name, the name `admission-policy run` uses: AP_WEBHOOK_CONFIG_NAME, else the
    default. A Helm install names them after its release; list them with:

    \b
      kubectl get validatingwebhookconfigurations -l app.kubernetes.io/managed-by=admission-policy-operator
    """
    import asyncio

    from ...cluster.client import new_api_client
    from ..uninstall import remove_configurations

    async def remove() -> list[str]:
        api_client = await new_api_client()
        async with api_client:
            return await remove_configurations(api_client, name)

    try:
        deleted = asyncio.run(remove())
    except Exception as exc:
        fail(RuntimeError(f"cannot delete the webhook configurations {name!r}: {exc}"))
    click.echo(f"deleted: {', '.join(deleted)}" if deleted else f"no webhook configurations named {name!r}")

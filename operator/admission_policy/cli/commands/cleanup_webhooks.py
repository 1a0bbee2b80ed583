"""``admission-policy cleanup-webhooks``: delete the operator's webhook configurations (uninstall)."""
from __future__ import annotations

import click

from ...operator.config import SETTINGS, OperatorConfig
from ..output import fail

# What `run` names them, so that no --name finds what it wrote: the same variable and default.
_NAME = SETTINGS["webhook_config_name"].env


@click.command("cleanup-webhooks")
@click.option("--name", envvar=_NAME, default=OperatorConfig.webhook_config_name, show_default=True,
              help=f"Name of both webhook configurations [env {_NAME}].")
def cleanup_webhooks_command(name: str) -> None:
    """Delete the operator's webhook configurations (uninstall). Absent ones are fine.

    Without --name, the name `admission-policy run` uses: AP_WEBHOOK_CONFIG_NAME, else the
    default. A Helm install names them after its release; list them with:

    \b
      kubectl get validatingwebhookconfigurations -l app.kubernetes.io/managed-by=admission-policy-operator
    """
    import asyncio

    from ...cluster.client import new_api_client
    from ...operator.registration import remove_configurations

    async def remove() -> list[str]:
        api_client = await new_api_client()
        async with api_client:
            return await remove_configurations(api_client, name)

    try:
        deleted = asyncio.run(remove())
    except Exception as exc:
        fail(RuntimeError(f"cannot delete the webhook configurations {name!r}: {exc}"))
    click.echo(f"deleted: {', '.join(deleted)}" if deleted else f"no webhook configurations named {name!r}")

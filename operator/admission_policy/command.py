"""``admission-policy``: the CLI's commands, and ``run``, which starts the operator with its
settings as flags or ``AP_*`` variables.

The CLI (``cli``) stands beside the operator on the same engine and never imports it; this
module, the console script's entry point, is the one place that puts the two together.
"""
from __future__ import annotations

import logging
import os
from typing import Any

import click

from .cli import main
from .cli.output import fail
from .config import SETTINGS, OperatorConfig, default_text

__all__ = ["main"]


def config_options(fn: Any) -> Any:
    """One option per setting of ``OperatorConfig``, named by its ``Setting.flag``: the flags, the
    variables and docs/configuration.md are the one list in config.py."""
    for name, setting in reversed(list(SETTINGS.items())):  # click lists options in reverse order of decoration
        default = default_text(name).replace("`", "")
        fn = click.option(setting.flag, name, default=None,
                          help=f"{setting.help} Default: {default}. [env {setting.env}]")(fn)
    return fn


@click.command("run")
@config_options
@click.option("--standalone", is_flag=True, help="No peering: this replica reconciles regardless of others.")
def run_command(standalone: bool, **flags: str | None) -> None:
    """Run the operator: reconciliation, webhooks, certificates, metrics.

    The same as `kopf run -m admission_policy.operator.handlers --all-namespaces`, with the
    settings given as flags or AP_* environment variables (flags win).
    """
    import kopf

    # Through the environment: the operator's start-up handler reads its settings from there.
    for name, value in flags.items():
        if value is not None:
            os.environ[SETTINGS[name].env] = value
    try:
        settings = OperatorConfig.from_env(os.environ)
    except ValueError as exc:
        fail(exc)
    logging_level = getattr(logging, settings.log_level)
    logging.basicConfig(level=logging_level, format="[%(asctime)s] %(name)-28s [%(levelname)-7s] %(message)s")
    import warnings

    # Kopf has logged why a start-up handler failed, in one line (e.g. a port in use): exit on it
    # without Kopf's traceback. (kopf 1.45 does not export ActivityError.)
    from kopf._core.engines.activities import ActivityError

    import admission_policy.operator.handlers  # noqa: F401  (registers the handlers)

    # Kopf leaves its login coroutine unawaited when start-up fails before it: noise, not news.
    warnings.filterwarnings("ignore", "coroutine 'authenticator' was never awaited", RuntimeWarning)
    try:
        kopf.run(clusterwide=True, standalone=standalone, liveness_endpoint=None)
    except ActivityError:
        raise SystemExit(1) from None


main.add_command(run_command)

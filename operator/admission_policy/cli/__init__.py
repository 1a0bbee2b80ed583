"""``admission-policy``: evaluate policies offline, with the very engine the webhook runs.

``run``, which starts the operator, is added by ``admission_policy.command``, the console
script's entry point: the CLI never imports the operator.

Exit codes: 0 success, 1 an expectation of a test suite failed (``audit``: an Enforce policy is
violated), 2 unusable input, 3 ``audit`` is incomplete (a resource could not be listed).
"""
from __future__ import annotations

import click

from .commands.audit import audit_command
from .commands.cleanup import cleanup_command
from .commands.cleanup_webhooks import cleanup_webhooks_command
from .commands.convert import convert_command
from .commands.lint import lint_command
from .commands.plugins import plugins_command
from .commands.review import review_command
from .commands.test import test_command


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="admission-policy-operator")
def main() -> None:
    """AdmissionPolicy: Kubernetes admission rules in CEL.

    \b
    Offline (no cluster):
      admission-policy test examples/                    run every AdmissionPolicyTest suite
      admission-policy test -p policy.yaml pod.yaml      show what the policies do to an object
      admission-policy review -p policy.yaml review.json print the webhook's AdmissionReview response
      admission-policy lint policies/                    compile only, for CI (exit 2 on any error);
                                                         says which could be ValidatingAdmissionPolicies
      admission-policy audit -p policies/ manifests/     what existing objects violate (exit 1: Enforce)
      admission-policy convert vap.yaml binding.yaml     ValidatingAdmissionPolicies → AdmissionPolicies
      admission-policy plugins                           list installed plugins and feature gates
    Operator:
      admission-policy run                               run the operator (Kopf) with settings from flags/env
      admission-policy cleanup                           uninstall: delete its webhook configurations and
                                                         the ValidatingAdmissionPolicies it generated
      admission-policy cleanup-webhooks                  delete its webhook configurations only
    """


main.add_command(test_command)
main.add_command(review_command)
main.add_command(lint_command)
main.add_command(audit_command)
main.add_command(convert_command)
main.add_command(plugins_command)
main.add_command(cleanup_command)
main.add_command(cleanup_webhooks_command)

"""The operator: ``kopf run -m admission_policy.operator.handlers --all-namespaces``.

Two paths share one process. Reconciliation (paused by Kopf peering on all but one replica)
drives each AdmissionPolicy's finalizer, conditions, phase and events. Serving (never paused)
runs in every replica: its own watcher loads policies into the PolicyStore, a loop writes the
webhook configurations, and Kopf's admission handlers answer every routed request from the
engine.

This module only imports the ones whose Kopf decorators register the handlers:

- ``lifecycle``: startup (building the ``Operator``, its background tasks) and cleanup;
- ``reconcile``: each policy's status, phase, events and finalizer;
- ``admission``: the validating and mutating webhooks.
"""
from . import admission, lifecycle, reconcile

__all__ = ["admission", "lifecycle", "reconcile"]

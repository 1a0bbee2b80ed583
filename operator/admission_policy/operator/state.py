"""What the handlers share: the one ``Operator`` built at startup, and ``operator()`` to reach it.

A module of its own so that lifecycle, reconciliation, admission and rotation each import it,
never one another.
"""
from __future__ import annotations

import dataclasses
import datetime

import aiohttp.web
import kopf
from kubernetes_asyncio import client

from ..cluster.discovery import Discovery
from ..config import OperatorConfig
from . import audit, certificates
from .decisions import DecisionLog
from .events import PolicyEvents
from .peering import leads_peering
from .sources import Sources
from .store import ExceptionStore, PolicyStore
from .supervision import Supervisor

REGISTRATION_TIMEOUT = 20.0   # how long a step that needs the configurations written waits for them


@dataclasses.dataclass
class Operator:
    """Everything the handlers and background tasks share, built once by ``lifecycle.startup``.

    Kopf calls the handlers as plain functions, with no place for our state; one object, built
    whole before Kopf starts watching, means a handler sees all of it or (before startup) none.
    ``config`` is ours (``AP_*``); ``kopf_settings`` is Kopf's, kept for peering and the server.
    """
    config: OperatorConfig
    store: PolicyStore
    api_client: client.ApiClient
    discovery: Discovery
    bundle: certificates.CertificateBundle
    events: PolicyEvents
    sources: Sources
    exceptions: ExceptionStore
    decisions: DecisionLog = dataclasses.field(default_factory=DecisionLog)
    kopf_settings: kopf.OperatorSettings | None = None
    auditor: audit.Auditor | None = None
    tasks: Supervisor = dataclasses.field(default_factory=Supervisor)
    runners: list[aiohttp.web.AppRunner] = dataclasses.field(default_factory=list)

    async def reconciles(self) -> bool:
        """Whether Kopf lets this replica reconcile now (standalone, or first in the peering)."""
        peering = self.kopf_settings.peering if self.kopf_settings is not None else None
        if peering is None or peering.standalone:
            return True
        return await leads_peering(self.api_client, peering.name, peering.priority)


_operator: Operator | None = None


def operator() -> Operator:
    """The running operator; a handler called before startup (or after cleanup) fails for good."""
    if _operator is None:
        raise kopf.PermanentError("the operator has not started")
    return _operator


def install(op: Operator) -> None:
    """Make ``op`` the running operator (startup)."""
    global _operator
    _operator = op


def uninstall() -> Operator | None:
    """Take the running operator away (cleanup), returning it to be closed; None if none runs."""
    global _operator
    op, _operator = _operator, None
    return op


def now() -> datetime.datetime:
    """The time status conditions and certificates are stamped with: aware, in UTC."""
    return datetime.datetime.now(datetime.UTC)

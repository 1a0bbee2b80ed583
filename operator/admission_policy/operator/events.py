"""Kubernetes Events on AdmissionPolicies (and exceptions), where ``kubectl describe`` finds them.

An AdmissionPolicy is cluster-scoped. Kubernetes keeps events about cluster-scoped objects in the
``default`` namespace with an empty ``involvedObject.namespace`` (what kubectl and the core
controllers do), and ``kubectl describe`` looks for exactly that. Kopf's own poster puts them in
the operator's namespace instead, where nothing finds them, so the operator posts its own.

Denials are counted and posted once per interval, so a flood of denied requests becomes one
event per policy, not one per request.
"""
from __future__ import annotations

import asyncio
import dataclasses
import datetime
import logging
from collections.abc import Callable

import aiohttp
from kubernetes_asyncio import client

from .. import api

logger = logging.getLogger(__name__)

EVENT_NAMESPACE = "default"   # where events about cluster-scoped objects live
MAX_MESSAGE = 1024


@dataclasses.dataclass
class _Tally:
    count: int = 0
    last_message: str = ""


class PolicyEvents:
    def __init__(self, component: str, interval: float = 30.0) -> None:
        self.component = component
        self.interval = interval
        self._tallies: dict[str, _Tally] = {}

    def record_denial(self, policy: str, message: str) -> None:
        """Called on the hot path: only counts."""
        tally = self._tallies.setdefault(policy, _Tally())
        tally.count += 1
        tally.last_message = message

    async def post(self, api_client: client.ApiClient, policy: str, uid: str | None, *,
                   type_: str, reason: str, message: str, kind: str = api.KIND, namespace: str = "") -> None:
        """Post one event about ``policy`` (or another object of ours: ``kind``, in ``namespace``
        when namespaced, where its events belong); a failure is logged, never raised: events are
        auxiliary. A failed post is dropped, not retried: the next interval's denials are posted
        anew, and a retry would only hold the poster up while the API server is away."""
        now = datetime.datetime.now(datetime.UTC)
        event = client.CoreV1Event(
            metadata=client.V1ObjectMeta(generate_name=f"{policy}.", namespace=namespace or EVENT_NAMESPACE),
            involved_object=client.V1ObjectReference(api_version=api.API_VERSION, kind=kind, name=policy,
                                                     namespace=namespace or None, uid=uid),
            reason=reason, message=message[:MAX_MESSAGE], type=type_,
            first_timestamp=now, last_timestamp=now, count=1,
            source=client.V1EventSource(component=self.component),
            reporting_component=self.component,
        )
        try:
            await client.CoreV1Api(api_client).create_namespaced_event(namespace or EVENT_NAMESPACE, event)
        except client.ApiException as exc:   # a refusal, or no answer in time (a 504, cluster/client.py)
            logger.warning("%s %s: cannot post the %s event: %s %s", kind, policy, reason, exc.status, exc.reason)
        except (aiohttp.ClientError, TimeoutError) as exc:   # the connection refused or cut; the client's own
            logger.warning("%s %s: cannot post the %s event: %s", kind, policy, reason, str(exc) or type(exc).__name__)

    async def post_policy(self, api_client: client.ApiClient, policy: str, uid: str | None, *, type_: str,
                          reason: str, message: str) -> None:
        """An event about the policy ``policy`` names: "name", or "namespace/name" for a
        NamespacedAdmissionPolicy, whose events belong to its namespace."""
        key = api.PolicyKey.parse(policy)
        await self.post(api_client, key.name, uid, type_=type_, reason=reason, message=message,
                        kind=key.kind, namespace=key.namespace or "")

    async def run(self, api_client: client.ApiClient, uid_of: Callable[[str], str | None]) -> None:
        """Post the denials counted in each interval."""
        while True:
            await asyncio.sleep(self.interval)
            tallies, self._tallies = self._tallies, {}
            for policy, tally in tallies.items():
                message = (f"denied {tally.count} request(s) in the last {self.interval:.0f}s; "
                           f"last: {tally.last_message}")
                await self.post_policy(api_client, policy, uid_of(policy), type_="Warning", reason="Denied",
                                       message=message)

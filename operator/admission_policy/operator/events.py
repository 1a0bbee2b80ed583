"""Kubernetes Events on policies: denials are counted and posted once per interval, so a flood
of denied requests becomes one event per policy, not one per request."""
from __future__ import annotations

import asyncio
import dataclasses
import datetime
import logging
from collections.abc import Callable

from kubernetes_asyncio import client

from .. import api

logger = logging.getLogger(__name__)


@dataclasses.dataclass
class _Tally:
    count: int = 0
    last_message: str = ""


class DenialEvents:
    def __init__(self, namespace: str, component: str, interval: float = 30.0) -> None:
        self.namespace = namespace
        self.component = component
        self.interval = interval
        self._tallies: dict[str, _Tally] = {}

    def record(self, policy: str, message: str) -> None:
        """Called on the hot path: only counts."""
        tally = self._tallies.setdefault(policy, _Tally())
        tally.count += 1
        tally.last_message = message

    async def run(self, api_client: client.ApiClient, uid_of: Callable[[str], str | None]) -> None:
        core = client.CoreV1Api(api_client)
        while True:
            await asyncio.sleep(self.interval)
            tallies, self._tallies = self._tallies, {}
            for policy, tally in tallies.items():
                message = (f"denied {tally.count} request(s) in the last {self.interval:.0f}s; "
                           f"last: {tally.last_message}")
                try:
                    await core.create_namespaced_event(self.namespace, self._event(policy, uid_of(policy), message))
                except client.ApiException as exc:
                    logger.warning("AdmissionPolicy %s: cannot post the denial event: %s", policy, exc.reason)

    def _event(self, policy: str, uid: str | None, message: str) -> client.CoreV1Event:
        now = datetime.datetime.now(datetime.UTC)
        return client.CoreV1Event(
            metadata=client.V1ObjectMeta(generate_name=f"{policy}."),
            involved_object=client.V1ObjectReference(api_version=api.API_VERSION, kind=api.KIND, name=policy,
                                                     uid=uid),
            reason="Denied", message=message[:1024], type="Warning",
            first_timestamp=now, last_timestamp=now, count=1,
            source=client.V1EventSource(component=self.component),
        )

"""Certificate rotation: renew the shared serving certificate when due, and adopt another
replica's renewal at once.

Order matters: the configurations trust a new CA before the server presents a certificate it
signed, or the API server's calls fail in between.
"""
from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Mapping
from typing import Any

from kubernetes_asyncio import client

from ..cluster.watch import watch_objects
from . import certificates
from .state import REGISTRATION_TIMEOUT, Operator, now
from .webhook import PolicyWebhookServer

logger = logging.getLogger(__name__)


class CertificateRotation:
    """The renewal loop and the Secret's watch, two background tasks sharing what they know.

    Kept in an object, not in the tasks' locals, so that a task restarted after dying
    (``supervision.py``) still knows which bundle is served and hears the Secret change.
    """

    def __init__(self, op: Operator) -> None:
        self.op = op
        self.served = op.bundle                   # the bundle whose files the server presents
        self.secret_changed = asyncio.Event()

    async def renew(self) -> None:
        """Adopt a renewed bundle: trust the new CA in the configurations first, then serve it.

        The shared Secret is checked every ``cert_check_interval`` (renewing it when due) and at
        once when it changes: another replica renewed it, or it was deleted by hand (recreated as a
        renewal of the bundle served here, whose CA stays trusted).
        """
        op = self.op
        core = client.CoreV1Api(op.api_client)
        while True:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(op.config.cert_check_interval):
                    await self.secret_changed.wait()
            self.secret_changed.clear()
            try:
                bundle = await certificates.ensure_certificates(core, op.config, now(), held=op.bundle)
            except Exception as exc:
                logger.warning("Checking the serving certificate failed: %s", exc)
                continue
            if bundle == self.served:
                continue
            op.bundle = bundle
            written = op.store.registration.writes
            op.store.changed.set()
            await op.store.registration.wait_write_after(written, timeout=REGISTRATION_TIMEOUT)
            # The API server calls with the caBundle its informer holds, a moment behind the write.
            await asyncio.sleep(op.config.cert_switch_grace)
            certificates.write_files(bundle, op.config.cert_dir)
            self.served = bundle
            server = op.kopf_settings.admission.server if op.kopf_settings is not None else None
            if isinstance(server, PolicyWebhookServer):
                server.files_written()
            logger.info("Serving certificate renewed; valid until %s", bundle.not_after.isoformat())

    async def watch_secret(self) -> None:
        """Trust a CA another replica wrote into the Secret at once: otherwise this replica's writer,
        seeing the configurations changed, would write its older caBundle back over the new one."""
        op = self.op
        name, namespace = op.config.cert_secret, op.config.namespace
        core = client.CoreV1Api(op.api_client)

        def on_event(kind: str, body: Mapping[str, Any]) -> None:
            if body.get("metadata", {}).get("name") != name:
                return
            if kind != "DELETED":
                try:
                    bundle = certificates.bundle_from_secret_data(body.get("data") or {})
                except certificates.CertificateError:
                    bundle = None
                if bundle is not None and bundle != op.bundle and not bundle.needs_renewal(
                        now(), certificates.serving_hosts(op.config)):
                    op.bundle = bundle
                    op.store.changed.set()
            self.secret_changed.set()

        def on_listed(names: set[str]) -> None:
            if name not in names:
                self.secret_changed.set()

        await watch_objects(
            f"Secret {namespace}/{name}",
            lambda **kw: core.list_namespaced_secret(namespace, field_selector=f"metadata.name={name}", **kw),
            on_event, on_listed)

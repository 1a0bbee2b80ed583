"""The emulated cluster for one scenario, in its own process (so the server's RSS and CPU are
the server's alone): kmock's KubernetesEmulator through the tests' harness.

    python bench/emulator_host.py --set pss --generated 1000 --timeout 240

Prints ``{"url", "kubeconfig"}`` once serving, with the policies already stored (the operator
finds them at startup, as after a restart); then ``{"active", "seconds", "phases"}`` once every
policy's ``status.phase`` is Active (or ``{"error"}`` at the timeout). Serves until stdin closes.
"""
from __future__ import annotations

import argparse
import asyncio
import collections
import copy
import sys
import time
import warnings
from typing import Any

import kmock
from kmock._internal import dsl, rendering  # kmock 0.8 does not export its views or Request type

import policies
from common import CLIENT_CORE, HARNESS, emit, pin

sys.path.insert(0, str(HARNESS))
from emulator import ADMISSION_POLICIES, NAMESPACES, Emulator

TENANT_POLICIES = "policy-operator.dev/v1alpha1/namespacedadmissionpolicies"

REQUEST_NAMESPACES = ("default", "shop")   # where the bench's requests live: watched, never fetched


def speed_up() -> None:
    """Make kmock find the reaction for a request in O(1) instead of O(requests served so far).

    kmock 0.8 checks whether a reaction's view holds the request being served by scanning
    every request recorded since the start through the view's filters (``View.__contains__``,
    by identity): quadratic over a run, and loading a thousand policies (tens of thousands of
    API calls) took many minutes, all in the emulator. The emulator's reactions are filter
    and priority chains over the root, which records a request before serving it, so such a
    view holds the request exactly when every filter of the chain accepts it. Anything else
    goes to kmock's own check. (This process only: the server under test never imports kmock.)
    """
    original = dsl.View.__contains__

    def contains(self: dsl.View, item: Any) -> bool:
        if isinstance(item, rendering.Request):
            node: dsl.View = self
            while isinstance(node, (dsl.Filter, dsl.Priority)):
                if isinstance(node, dsl.Filter) and not node.criteria(item):
                    return False
                node = node._source
            if isinstance(node, dsl.Root):
                return True
        return original(self, item)

    dsl.View.__contains__ = contains  # type: ignore[method-assign]


def declare_cluster(emu: Emulator) -> None:
    """Serve the same resources in every scenario (see policies.py)."""
    bundled = kmock.ResourcesArray()
    with warnings.catch_warnings():  # kmock 0.8 uses the deprecated importlib.resources.read_binary
        warnings.simplefilter("ignore", DeprecationWarning)
        bundled.load_bundled()
    seen: set[tuple[str | None, str | None]] = set()
    for resource in bundled:
        key = (resource.group, resource.plural)
        if resource.group in policies.SKIPPED_GROUPS or key in seen:
            continue   # bundled lists the preferred version first
        seen.add(key)
        if resource not in emu.kmock.resources:
            emu.kmock.resources[resource] = copy.deepcopy(bundled[resource])
    for crd in policies.crds():
        emu.declare_crd(crd, store=True)


def preload(emu: Emulator, bodies: list[dict[str, Any]]) -> None:
    for name in REQUEST_NAMESPACES:
        emu.kmock.put_object(NAMESPACES, {"metadata": {"name": name, "labels": {"kubernetes.io/metadata.name": name}}})
    for body in bodies:
        namespace = body["metadata"].get("namespace")
        if namespace and (kmock.resource(NAMESPACES), None, namespace) not in emu.kmock.objects:
            emu.kmock.put_object(NAMESPACES, {"metadata": {"name": namespace,
                                                           "labels": {"kubernetes.io/metadata.name": namespace}}})
        emu.kmock.put_object(TENANT_POLICIES if namespace else ADMISSION_POLICIES, body)


def phases(emu: Emulator, names: list[str]) -> collections.Counter[str]:
    """Phase per policy ("namespace/name" for a tenant's), read from storage without copying
    (peek() deep-copies)."""
    counts: collections.Counter[str] = collections.Counter()
    for name in names:
        namespace, _, own = name.rpartition("/")
        key = (kmock.resource(TENANT_POLICIES if namespace else ADMISSION_POLICIES), namespace or None, own)
        stored = emu.kmock.objects[key].raw if key in emu.kmock.objects else {}
        counts[str((stored.get("status") or {}).get("phase"))] += 1
    return counts


async def wait_active(emu: Emulator, names: list[str], timeout: float) -> None:
    started = time.monotonic()
    counts = phases(emu, names)
    while counts["Active"] < len(names):
        if time.monotonic() - started > timeout:
            emit(error=f"not all policies Active after {timeout:.0f}s", phases=dict(counts))
            return
        await asyncio.sleep(0.25)
        counts = phases(emu, names)
    emit(active=len(names), seconds=round(time.monotonic() - started, 2), phases=dict(counts))


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--set", choices=sorted(policies.SETS), default="none")
    parser.add_argument("--generated", type=int, default=0)
    parser.add_argument("--tenants", type=int, default=0, help="tenant policies, over half as many namespaces")
    parser.add_argument("--timeout", type=float, default=240.0)
    args = parser.parse_args()
    pin(CLIENT_CORE)

    speed_up()
    bodies = (policies.example_set(args.set) + policies.generated(args.generated)
              + policies.tenants(args.tenants, max(args.tenants // 2, 1)))
    async with Emulator() as emu:
        declare_cluster(emu)
        preload(emu, bodies)
        emit(url=emu.url, kubeconfig=str(emu.kubeconfig))
        names = ["/".join(filter(None, (b["metadata"].get("namespace"), b["metadata"]["name"]))) for b in bodies]
        waiting = asyncio.create_task(wait_active(emu, names, args.timeout))
        # Serve until the orchestrator closes our stdin (it also does so when it dies).
        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)
        waiting.cancel()


if __name__ == "__main__":
    asyncio.run(main())

"""Operator replicas of a test's own, as the chart runs them: one, or several peering behind one address.

The session's operator (conftest.py) writes the same webhook configurations, so :func:`replicas`
stops it while the test's replicas run and starts it again on the way out. With Kopf peering
(the chart's ``ClusterKopfPeering``, ``AP_POD_NAME``/``POD_ID``) one replica reconciles and the
others pause; behind a :class:`TcpProxy` the API server reaches all of them through one address,
as through the chart's Service.

Also here: what the tests read of a replica (its log, its metrics) and of the webhook
configurations (which webhook routes which resources).
"""
from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import pathlib
import re
import threading
from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import pykube
import pytest
import requests
import yaml
from e2e_kube import OWNED_LABEL, ROOT, Cluster, ClusterKopfPeering, OperatorProcess, eventually, unique
from prometheus_client.parser import text_string_to_metric_families
from pykube.objects import APIObject

DOMAIN = "policy-operator.dev"
POLICY_WEBHOOK = f"policies.validate.{DOMAIN}"   # the fixed entry that validates AdmissionPolicies
TENANT_POLICY_WEBHOOK = f"tenant-policies.validate.{DOMAIN}"   # ... and NamespacedAdmissionPolicies
EXCEPTION_WEBHOOKS = (f"exceptions.validate.{DOMAIN}",   # the fixed entries that review AdmissionPolicyExceptions
                      f"exceptions.mutate.{DOMAIN}")
FAIL_WEBHOOK = f"fail.validate.{DOMAIN}"         # routes the resources of failurePolicy Fail policies
IGNORE_WEBHOOK = f"ignore.validate.{DOMAIN}"     # ... and of failurePolicy Ignore ones
PROBE_WEBHOOK = f"probe.validate.{DOMAIN}"       # one dry-run Event name: native enforcement's proof of a write
PEERING_CRD_FILE = ROOT / "charts" / "admission-policy-operator" / "crds" / "kopfpeering.yaml"
PEERING_CRD = "clusterkopfpeerings.kopf.dev"
# The cause, in the API server's "failed calling webhook" message, of a call whose connection broke.
BROKEN_CONNECTION = re.compile(r"EOF|connection reset by peer|broken pipe|connection refused")
PAUSED = "Pausing operations in favour of"   # Kopf's log line on a replica that does not reconcile


# --- the webhook configurations -----------------------------------------------------------------------------

def webhooks(cluster: Cluster, cls: type[APIObject]) -> list[dict[str, Any]]:
    answer = cluster.get(cls, cluster.settings.webhook_config_name)
    assert answer.ok, f"{cls.kind} {cluster.settings.webhook_config_name}: {answer}"
    hooks: list[dict[str, Any]] = answer.obj.get("webhooks") or []
    return hooks


def routed(hooks: Sequence[dict[str, Any]]) -> dict[str, set[str]]:
    """Webhook name → the resources its rules route."""
    return {hook["name"]: {resource for r in hook.get("rules") or [] for resource in r.get("resources") or []}
            for hook in hooks}


# --- what a replica says ------------------------------------------------------------------------------------

def log_of(replica: OperatorProcess) -> str:
    return replica.log_path.read_text(errors="replace")


def pauses(replica: OperatorProcess) -> int:
    """How often Kopf paused the replica's reconciliation in favour of a peer of higher priority."""
    return log_of(replica).count(PAUSED)


def show_log(request: pytest.FixtureRequest, replica: OperatorProcess) -> None:
    """The replica's log tail in the test's report (shown when it fails)."""
    request.node.add_report_section("call", f"replica log ({replica.log_path})", replica.log_tail(60))


def reconciled(replica: OperatorProcess, policy: str) -> bool:
    """The replica logged a phase transition of ``policy``: only a reconciling replica does."""
    return re.search(rf"AdmissionPolicy {re.escape(policy)}: \S+ → Active", log_of(replica)) is not None


def requests_judged(replica: OperatorProcess, policy: str) -> int:
    """Admission requests ``policy`` judged in this replica, from its Prometheus metrics."""
    text = requests.get(f"http://127.0.0.1:{replica.metrics_port}/metrics", timeout=5).text
    return int(sum(sample.value for family in text_string_to_metric_families(text) for sample in family.samples
                   if sample.name == "admission_policy_requests_total" and sample.labels.get("policy") == policy))


# --- one address in front of several replicas ---------------------------------------------------------------

class TcpProxy:
    """What the operator's Service is to the API server in-cluster: one address, several replicas.

    TLS passes through untouched (the replicas present the shared certificate). Each new connection
    goes to the next replica in turn; a replica that refuses the connection is skipped for the next
    one, as kube-proxy stops sending to an endpoint that went unready. When a replica's side of a
    connection ends, the API server's side is closed too — reset, if the replica's was — which is
    what the API server sees of a replica killed mid-request. Runs its own event loop in a thread.
    """

    def __init__(self) -> None:
        self.backends: list[int] = []
        self.port = 0
        self.connections: Counter[int] = Counter()   # backend port → connections it took
        self.open: Counter[int] = Counter()          # backend port → connections open now
        self.refused: Counter[int] = Counter()       # backend port → connections it refused
        self.unserved = 0                            # connections no backend took
        self._turn = 0
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="e2e-service-proxy", daemon=True)
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    def start(self) -> None:
        self._thread.start()
        # On all addresses, like the operator: the API server comes through E2E_ADVERTISE_HOST.
        future = asyncio.run_coroutine_threadsafe(asyncio.start_server(self._connect, "0.0.0.0", 0), self._loop)
        self._server = future.result(10)
        self.port = int(self._server.sockets[0].getsockname()[1])

    def stop(self) -> None:
        async def close() -> None:
            if self._server is not None:
                self._server.close()
            for task in list(self._tasks):
                task.cancel()
            await asyncio.gather(*self._tasks, return_exceptions=True)

        if self._thread.is_alive():
            asyncio.run_coroutine_threadsafe(close(), self._loop).result(10)
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(10)
        self._loop.close()

    async def _connect(self, client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        try:
            # This connection's order, taken at once: other connections advance the turn meanwhile.
            turn, self._turn = self._turn % max(1, len(self.backends)), self._turn + 1
            for port in self.backends[turn:] + self.backends[:turn]:
                try:
                    backend_reader, backend_writer = await asyncio.open_connection("127.0.0.1", port)
                except OSError:
                    self.refused[port] += 1
                    continue
                self.connections[port] += 1
                self.open[port] += 1
                try:
                    await self._relay(client_reader, client_writer, backend_reader, backend_writer)
                finally:
                    self.open[port] -= 1
                return
            self.unserved += 1
            client_writer.transport.abort()
        finally:
            self._tasks.discard(task)

    @staticmethod
    async def _relay(client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter,
                     backend_reader: asyncio.StreamReader, backend_writer: asyncio.StreamWriter) -> None:
        async def pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            while data := await reader.read(65536):
                writer.write(data)
                await writer.drain()

        upstream = asyncio.ensure_future(pipe(client_reader, backend_writer))
        downstream = asyncio.ensure_future(pipe(backend_reader, client_writer))
        try:
            await asyncio.wait({upstream, downstream}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in (upstream, downstream):
                task.cancel()
            results = await asyncio.gather(upstream, downstream, return_exceptions=True)
            broken = any(isinstance(result, OSError) for result in results)
            for writer in (client_writer, backend_writer):
                if broken:
                    writer.transport.abort()   # a reset on one side is a reset on the other
                else:
                    writer.close()


# --- the test's own replicas --------------------------------------------------------------------------------

@dataclasses.dataclass
class Replicas:
    """The replicas :func:`replicas` made: pod name → process, the leader first once started with peering."""
    pods: dict[str, OperatorProcess]
    peering: str | None
    behind: TcpProxy | None
    cluster: Cluster

    @property
    def processes(self) -> list[OperatorProcess]:
        return list(self.pods.values())

    @property
    def proxy(self) -> TcpProxy:
        assert self.behind is not None, "these replicas are not behind a proxy"
        return self.behind

    def pod(self, replica: OperatorProcess) -> str:
        return next(pod for pod, process in self.pods.items() if process is replica)

    def start(self) -> None:
        """Start every replica (each until ready and reached by the API server); with peering, wait
        until their priorities are known and all but the leader paused, and put the leader first."""
        for replica in self.pods.values():
            replica.start()
        peering = self.peering
        if peering is None or len(self.pods) < 2:
            return
        timeout = self.cluster.settings.timeout
        status = eventually(lambda: self.cluster.get(ClusterKopfPeering, peering).obj.get("status") or {},
                            lambda peers: set(self.pods) <= set(peers), "every replica's keep-alive", timeout)
        priorities = {pod: status[pod]["priority"] for pod in self.pods}
        assert len(set(priorities.values())) == len(priorities), f"equal priorities pause everyone: {priorities}"
        self.pods = {pod: self.pods[pod] for pod in sorted(self.pods, key=priorities.__getitem__, reverse=True)}
        for pod, follower in list(self.pods.items())[1:]:
            eventually(functools.partial(pauses, follower), lambda n: n >= 1, f"{pod} to pause reconciliation",
                       timeout)


def ensure_peering_crd(cluster: Cluster) -> None:
    """The chart's peering CRD, installed as Helm installs crds/ (created when missing)."""
    if cluster.get(pykube.CustomResourceDefinition, PEERING_CRD).status == 404:
        crd = cluster.create(pykube.CustomResourceDefinition, yaml.safe_load(PEERING_CRD_FILE.read_text()))
        assert crd.ok, str(crd)
    cluster.kubectl("wait", "--for=condition=Established", f"crd/{PEERING_CRD}", "--timeout=60s")


@contextlib.contextmanager
def replicas(cluster: Cluster, operator: OperatorProcess, tmp_path: pathlib.Path, request: pytest.FixtureRequest,
             count: int = 2, *, peering: bool = True, proxy: bool = True, env: Mapping[str, str] | None = None,
             kubeconfig: pathlib.Path | None = None, prefix: str = "ap-e2e-replica",
             start: bool = True) -> Iterator[Replicas]:
    """``count`` operator replicas of the test's own, instead of the session's operator.

    ``peering``: Kopf peering on a ClusterKopfPeering of their own (else each runs standalone);
    ``proxy``: the API server reaches them through one :class:`TcpProxy` (``AP_ADVERTISE_PORT``);
    ``env``: extra settings; ``start=False``: the test calls :meth:`Replicas.start` itself, after
    preparing what they should meet. On the way out, in this order: their log tails into the
    report, the replicas stopped, the proxy, the peering object, the session's operator started
    again. Delete the test's policies inside the block: their finalizers need a live replica.
    """
    with contextlib.ExitStack() as cleanup:
        # Last registered, first run.
        cleanup.callback(lambda: None if operator.alive() else operator.start())
        operator.stop()
        extra: dict[str, str] = {}
        peering_name = None
        if peering:
            ensure_peering_crd(cluster)
            peering_name = unique(f"{prefix}-peering")
            created = cluster.create(ClusterKopfPeering, {
                "apiVersion": "kopf.dev/v1", "kind": "ClusterKopfPeering",
                "metadata": {"name": peering_name, "labels": {OWNED_LABEL: "true"}}})
            assert created.ok, str(created)
            cleanup.callback(cluster.delete, ClusterKopfPeering, peering_name)
            extra["AP_PEERING_NAME"] = peering_name
        front = None
        if proxy:
            front = TcpProxy()
            front.start()
            cleanup.callback(front.stop)
            extra["AP_ADVERTISE_PORT"] = str(front.port)
        pods: dict[str, OperatorProcess] = {}
        for index in range(count):
            pod = f"{prefix}-{index}"
            (tmp_path / pod).mkdir()
            replica = OperatorProcess(cluster, tmp_path / f"{pod}.log", tmp_path / pod, kubeconfig=kubeconfig,
                                      standalone=not peering,
                                      env={"AP_POD_NAME": pod, "POD_ID": pod, **extra, **(env or {})})
            replica.pidfile = replica.pidfile.with_name(f"{replica.pidfile.stem}-{pod}.pid")   # not the session's
            pods[pod] = replica
            cleanup.callback(replica.stop)
            cleanup.callback(show_log, request, replica)
        if front is not None:
            front.backends = [replica.listen_port for replica in pods.values()]
        group = Replicas(pods, peering_name, front, cluster)
        if start:
            group.start()
        yield group

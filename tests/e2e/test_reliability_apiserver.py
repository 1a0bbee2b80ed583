"""Issue 12, scenario 3: the API server, etcd and the operator's watch fail while traffic flows.

What a user relies on (docs/design.md, "Serving": serving continues from the last policy set):

- while the API server is down, no request reaches the operator (the API server is the caller);
  the operator's webhook server never stops, and the moment the API server is back its answers
  are the policies' — zero wrong decisions before, during and after; the errors clients see are
  the API server's own (connection refused, "not yet ready"), counted apart;
- /readyz stays 200 throughout (an unready replica would leave the API server with nobody to
  call), and says which watch is down while it is: "ready; not watching AdmissionPolicies ...";
- once the API server is back the operator resyncs: a policy edited, deleted or created just
  after the outage — or while only the operator's connections were cut — is enforced as written,
  and after etcd's history is compacted past everything the operator saw it lists again without
  forgetting the policies that still exist. (The API server resets its watches when it stops, and
  the watcher lists again after any failure, so a 410 Gone *on resume* — a watch that ended cleanly
  and resumes from a compacted resourceVersion — is proven against the emulator, in
  tests/operator/test_watch_resync.py.)

Recovery times are printed with the figures, never asserted.
"""
from __future__ import annotations

import asyncio
import base64
import dataclasses
import pathlib
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import pytest
import requests
import yaml
from e2e_kube import Answer, Cluster, OperatorProcess, eventually, unique
from envtest import ControlPlane
from replicas import TcpProxy, replicas
from traffic import (
    SCALE,
    Figures,
    Generation,
    PolicyDriver,
    Sent,
    Timeline,
    Traffic,
    Variant,
    judge,
    report,
    scaled,
)

pytestmark = pytest.mark.e2e

SELECTOR_KEY = "e2e.policy-operator.dev/traffic"
ERROR_PAUSE = 0.1   # a client whose request got no answer waits this long, as a backing-off client does
PROBE_INTERVAL = 0.2
# The API server stops listening at SIGTERM but its process lingers ~30 s: a restart would spend
# that before starting again. The kubelet's grace is 30 s; the bounded form kills it sooner.
APISERVER_GRACE = 3.0 * SCALE
ETCD_DOWN = 3.0 * SCALE   # long enough for requests to meet an API server without its storage
NOT_WATCHING = "not watching AdmissionPolicies"


@pytest.fixture
def plane(control_plane: ControlPlane | None) -> ControlPlane:
    if control_plane is None:
        pytest.skip("restarting the API server or etcd needs the envtest control plane this session started "
                    "(KUBEBUILDER_ASSETS), not an external cluster")
    return control_plane


class PacedTraffic(Traffic):
    """Traffic whose clients pause briefly after an answer that is no answer (the API server down)
    or an API server error, so that an outage does not spend the whole request budget in a second."""

    def _record(self, client: int, sent: float, answer: Answer | None, error: str) -> None:
        super()._record(client, sent, answer, error)
        if answer is None or answer.status >= 500 or answer.status == 429:
            time.sleep(ERROR_PAUSE)


@dataclasses.dataclass(frozen=True)
class Probe:
    at: float
    status: int     # 0: no answer
    text: str


class ReadyzProbe:
    """Polls the operator's /readyz in a thread for as long as it is entered."""

    def __init__(self, port: int) -> None:
        self.url = f"http://127.0.0.1:{port}/readyz"
        self.probes: list[Probe] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="readyz-probe", daemon=True)

    def __enter__(self) -> ReadyzProbe:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join(10)

    def between(self, start: float, end: float) -> list[Probe]:
        return [p for p in list(self.probes) if start <= p.at <= end]

    def latest(self) -> Probe | None:
        return self.probes[-1] if self.probes else None

    def _run(self) -> None:
        while not self._stop.is_set():
            at = time.monotonic()
            try:
                response = requests.get(self.url, timeout=2)
                self.probes.append(Probe(at, response.status_code, response.text))
            except requests.RequestException as exc:
                self.probes.append(Probe(at, 0, repr(exc)))
            self._stop.wait(PROBE_INTERVAL)


def first_right_after(answers: Sequence[Sent], timeline: Timeline, moment: float) -> float:
    """Seconds from ``moment`` to the first answer (sent after it) that the policies account for."""
    right = [a.answered for a in answers if a.sent >= moment and not a.error and judge(a, timeline) is None]
    return min(right) - moment if right else float("nan")


def error_kinds(answers: Sequence[Sent]) -> str:
    """The errors by kind: "no answer" (connection refused, reset) or the API server's HTTP status."""
    kinds = Counter("no answer" if a.status == 0 else f"HTTP {a.status}" for a in answers if a.error)
    return ", ".join(f"{kind} {count}" for kind, count in kinds.most_common()) or "none"


def judged_by(answers: Sequence[Sent], generation: Generation) -> int:
    """Answers sent after ``generation`` was in effect that carry its tag (proof it judged them)."""
    assert generation.ready is not None
    return sum(1 for a in answers if a.sent >= generation.ready and any(
        (policy, n) == (generation.policy, generation.n) for policy, n, _ in a.tags()))


def check_readiness(probes: Sequence[Probe], what: str) -> None:
    """Never unready, never unreachable: the operator serves its last policy set throughout."""
    assert probes, f"no /readyz probe during {what}"
    bad = [p for p in probes if p.status != 200]
    assert not bad, f"/readyz was not 200 during {what}: {bad[:3]}"


def wait_in_sync(probe: ReadyzProbe, timeout: float) -> float:
    """Until /readyz no longer reports a watch down; returns when that was first seen."""
    latest = eventually(probe.latest, lambda p: p is not None and p.text == "ready",
                        "/readyz to report every watch in sync again", timeout, interval=PROBE_INTERVAL)
    assert latest is not None
    return latest.at


def write_three(driver: PolicyDriver, kept: str, edited: str, deleted: str) -> None:
    """What the outage meets: a policy kept as it is, one edited and one deleted afterwards, all Active."""
    driver.write(kept, Variant("Enforce"))
    driver.write(edited, Variant("Warn"))
    driver.write(deleted, Variant("Enforce", expression=1))


# --- (a) the API server restarted ---------------------------------------------------------------------------

def test_api_server_restart_under_load_keeps_decisions_right_and_resyncs(
        cluster: Cluster, operator: OperatorProcess, plane: ControlPlane,
        namespace: Callable[..., str]) -> None:
    selector = (SELECTOR_KEY, unique("apiserver"))
    ns = namespace({selector[0]: selector[1]})
    timeline = Timeline()
    driver = PolicyDriver(cluster, timeline, selector)
    kept, edited, deleted, created = (unique(f"apiserver-{role}") for role in ("kept", "edited", "deleted", "created"))
    try:
        write_three(driver, kept, edited, deleted)
        with PacedTraffic(cluster, ns, clients=4, limit=scaled(2000)) as traffic, \
                ReadyzProbe(operator.health_port) as probe:
            traffic.wait(scaled(100), cluster.settings.timeout)
            down = time.monotonic()
            plane.restart_apiserver(APISERVER_GRACE)   # every watch of the operator drops with it
            back = time.monotonic()
            # Written the moment the API server is back: the operator must have resynced to enforce them.
            after = [driver.write(edited, Variant("Enforce", expression=2)), driver.delete(deleted),
                     driver.write(created, Variant("Warn", expression=3))]
            in_sync = wait_in_sync(probe, cluster.settings.timeout)
            traffic.wait(scaled(200), cluster.settings.timeout)
            answers = traffic.stop()
            during = probe.between(down, back)
    finally:
        driver.delete_all()
    figures = report(Figures.of(
        "API server restarted under load", answers, timeline, errors_by_kind=error_kinds(answers), outage_s=back - down,
        back_to_first_right_answer_s=first_right_after(answers, timeline, back),
        back_to_watch_in_sync_s=in_sync - back,
        write_to_active_after_recovery_s=max(g.ready - g.submitted for g in after if g.ready is not None)))
    assert figures.wrong == 0, "\n".join([figures.line(), *figures.wrong_examples])
    assert operator.alive(), "the operator exited while the API server restarted"
    check_readiness(during, "the API server's restart")
    assert any(NOT_WATCHING in p.text for p in during), \
        f"/readyz never said the policy watch was down during the restart: {[p.text for p in during][:5]}"
    for generation in (after[0], after[2]):
        assert judged_by(answers, generation), f"{generation.policy}#{generation.n} judged nothing: {figures.line()}"


# --- (b) etcd restarted -------------------------------------------------------------------------------------

def test_etcd_restart_under_load_keeps_decisions_right_and_resyncs(
        cluster: Cluster, operator: OperatorProcess, plane: ControlPlane,
        namespace: Callable[..., str]) -> None:
    selector = (SELECTOR_KEY, unique("etcd"))
    ns = namespace({selector[0]: selector[1]})
    timeline = Timeline()
    driver = PolicyDriver(cluster, timeline, selector)
    kept, edited = unique("etcd-kept"), unique("etcd-edited")
    try:
        driver.write(kept, Variant("Enforce"))
        driver.write(edited, Variant("Warn"))
        # Dry-run creates need no etcd, so the traffic runs at full speed through the outage: the limit
        # only bounds it, the waits below end it (a tight limit ran out before the edit was in effect).
        with PacedTraffic(cluster, ns, clients=4, limit=scaled(6000)) as traffic, \
                ReadyzProbe(operator.health_port) as probe:
            traffic.wait(scaled(100), cluster.settings.timeout)
            down = time.monotonic()
            plane.restart_etcd(ETCD_DOWN)
            back = time.monotonic()
            after = driver.write(edited, Variant("Enforce", expression=2))
            traffic.wait(scaled(200), cluster.settings.timeout)
            answers = traffic.stop()
            during = probe.between(down, back)
    finally:
        driver.delete_all()
    figures = report(Figures.of(
        "etcd restarted under load", answers, timeline, errors_by_kind=error_kinds(answers), outage_s=back - down,
        back_to_first_right_answer_s=first_right_after(answers, timeline, back),
        write_to_active_after_recovery_s=(after.ready or back) - after.submitted))
    assert figures.wrong == 0, "\n".join([figures.line(), *figures.wrong_examples])
    assert operator.alive(), "the operator exited while etcd restarted"
    check_readiness(during, "etcd's restart")
    assert judged_by(answers, after), f"{after.policy}#{after.n} judged nothing: {figures.line()}"


# --- (c) the operator's watch dropped, (d) history compacted while the API server is down ------------------

class ApiServerProxy(TcpProxy):
    """The operator's only way to the API server, which the test can cut (every connection reset,
    new ones refused: the API server looks gone to the operator alone) or hold (new connections
    wait for the API server to come back, as a load balancer in front of several API servers hands
    a reconnecting client to another one)."""

    def __init__(self, upstream: int) -> None:
        super().__init__()
        self.backends = [upstream]
        self.refusing = False
        self.holding = False
        self._clients: set[asyncio.StreamWriter] = set()

    def cut(self) -> None:
        def abort() -> None:
            self.refusing = True
            for writer in list(self._clients):
                writer.transport.abort()
        self._loop.call_soon_threadsafe(abort)

    def restore(self) -> None:
        self.refusing = False

    async def _connect(self, client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        self._clients.add(client_writer)
        try:
            deadline = self._loop.time() + 60
            while not self.refusing:
                try:
                    backend_reader, backend_writer = await asyncio.open_connection("127.0.0.1", self.backends[0])
                except OSError:
                    if not self.holding or self._loop.time() > deadline:
                        break
                    await asyncio.sleep(0.05)
                    continue
                self.connections[self.backends[0]] += 1
                await self._relay(client_reader, client_writer, backend_reader, backend_writer)
                return
            client_writer.transport.abort()
        finally:
            self._clients.discard(client_writer)
            self._tasks.discard(task)


@pytest.fixture
def proxied_operator(cluster: Cluster, operator: OperatorProcess, plane: ControlPlane, tmp_path: pathlib.Path,
                     request: pytest.FixtureRequest) -> Iterator[tuple[OperatorProcess, ApiServerProxy]]:
    """The operator reaching the API server only through an :class:`ApiServerProxy` (the API server
    still calls its webhook directly). It replaces the session's operator meanwhile: two would write
    the same webhook configurations."""
    proxy = ApiServerProxy(plane.port)
    proxy.start()
    config = yaml.safe_load(cluster.settings.kubeconfig.read_text())
    for entry in config["clusters"]:
        entry["cluster"]["server"] = f"https://127.0.0.1:{proxy.port}"   # the API server's cert names 127.0.0.1
    kubeconfig = tmp_path / "proxied.kubeconfig"
    kubeconfig.write_text(yaml.safe_dump(config))
    try:
        with replicas(cluster, operator, tmp_path, request, 1, peering=False, proxy=False, kubeconfig=kubeconfig,
                      prefix="ap-e2e-proxied") as group:
            yield group.processes[0], proxy
    finally:
        proxy.stop()


def etcd_call(plane: ControlPlane, method: str, body: dict[str, Any]) -> dict[str, Any]:
    """etcd's v3 JSON gateway (keys and values base64)."""
    response = requests.post(f"{plane.etcd_url}/v3/{method}", json=body, timeout=10)
    assert response.ok, f"etcd {method}: HTTP {response.status_code} {response.text}"
    answer: dict[str, Any] = response.json()
    return answer


def compact_etcd(plane: ControlPlane) -> int:
    """Write a key (so that the revision moves past everything the operator saw), then compact
    etcd's history up to it, physically: a watch from any earlier resourceVersion is 410 Gone."""
    key = base64.b64encode(f"/e2e-compaction/{unique('bump')}".encode()).decode()
    put = etcd_call(plane, "kv/put", {"key": key, "value": base64.b64encode(b"x").decode()})
    header = put["header"]
    assert isinstance(header, dict), put
    revision = int(header["revision"])
    etcd_call(plane, "kv/compaction", {"revision": revision, "physical": True})
    etcd_call(plane, "kv/deleterange", {"key": key})
    return revision


def test_watch_dropped_and_history_compacted_resync_without_losing_a_policy(
        cluster: Cluster, plane: ControlPlane, proxied_operator: tuple[OperatorProcess, ApiServerProxy],
        namespace: Callable[..., str]) -> None:
    replica, proxy = proxied_operator
    selector = (SELECTOR_KEY, unique("watch"))
    ns = namespace({selector[0]: selector[1]})
    timeline = Timeline()
    driver = PolicyDriver(cluster, timeline, selector)
    kept, edited, deleted, created = (unique(f"watch-{role}") for role in ("kept", "edited", "deleted", "created"))
    try:
        write_three(driver, kept, edited, deleted)
        with PacedTraffic(cluster, ns, clients=4, limit=scaled(2000)) as traffic, \
                ReadyzProbe(replica.health_port) as probe:
            traffic.wait(scaled(100), cluster.settings.timeout)

            # (c) Only the operator loses the API server: every watch drops, nothing reconnects.
            cut = time.monotonic()
            proxy.cut()
            eventually(probe.latest, lambda p: p is not None and NOT_WATCHING in p.text,
                       "/readyz to say the policy watch is down", cluster.settings.timeout, interval=PROBE_INTERVAL)
            served_while_cut = len(traffic.answers)
            # Written while the operator cannot see them; its webhook still validates them (the API
            # server calls it directly), and its last policy set keeps answering the traffic.
            unseen = [driver.submit(edited, Variant("Enforce", expression=2)),
                      driver.submit(created, Variant("Warn", expression=3))]
            driver.remove(deleted)
            traffic.wait(scaled(100), cluster.settings.timeout)
            served_while_cut = len(traffic.answers) - served_while_cut
            restored = time.monotonic()
            cut_probes = probe.between(cut, restored)
            proxy.restore()
            driver.settle(cluster.settings.timeout)   # the edits Active, the deleted policy gone
            resynced = wait_in_sync(probe, cluster.settings.timeout)

            # (d) The API server stops (its watches drop), history is compacted past every revision the
            # operator saw, and the API server comes back: whatever resumes from before is 410 Gone.
            proxy.holding = True
            down = time.monotonic()
            plane.stop_apiserver(APISERVER_GRACE)
            compacted = compact_etcd(plane)
            plane.start_apiserver()
            back = time.monotonic()
            proxy.holding = False
            final = driver.write(edited, Variant("Warn", expression=4))
            in_sync = wait_in_sync(probe, cluster.settings.timeout)
            traffic.wait(scaled(200), cluster.settings.timeout)
            answers = traffic.stop()
            restart_probes = probe.between(down, back)
            log = replica.log_path.read_text(errors="replace")   # before the cleanup deletes the policies
    finally:
        driver.delete_all()
    figures = report(Figures.of(
        "watch dropped, history compacted", answers, timeline, errors_by_kind=error_kinds(answers),
        served_while_cut=served_while_cut,
        cut_s=restored - cut, restore_to_active_s=max((g.ready or restored) - restored for g in unseen),
        restore_to_watch_in_sync_s=resynced - restored, compacted_revision=compacted,
        back_to_first_right_answer_s=first_right_after(answers, timeline, back),
        back_to_watch_in_sync_s=in_sync - back,
        write_to_active_after_recovery_s=(final.ready or back) - final.submitted,
        # The API server resets its watches when it stops, and the watcher lists again after any
        # failure: a 410 on resume needs a watch that ended cleanly (tests/operator covers it).
        resumed_into_410=log.count("AdmissionPolicies: resourceVersion")))
    assert figures.wrong == 0, "\n".join([figures.line(), *figures.wrong_examples])
    assert replica.alive(), "the operator exited"
    check_readiness(cut_probes, "the cut")
    check_readiness(restart_probes, "the API server's restart")
    # The API server calls the webhook directly: cut off from it, the operator still answers every request.
    errors_while_cut = [a for a in answers if cut <= a.sent and a.answered <= restored and a.error]
    assert served_while_cut > 0 and not errors_while_cut, f"{figures.line()}; e.g. {errors_while_cut[:2]}"
    for generation in unseen:
        assert judged_by(answers, generation), f"{generation.policy}#{generation.n} judged nothing: {figures.line()}"
    assert judged_by(answers, final), f"{final.policy}#{final.n} judged nothing: {figures.line()}"
    assert f"AdmissionPolicy {kept}: no longer enforced" not in log, "a policy that still exists was forgotten"

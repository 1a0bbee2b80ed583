"""Operator processes that die without warning (SIGKILL), seen through a real API server.

A graceful stop is covered by test_e2e_shutdown.py. Here nothing of the operator runs on the way
out — no Kopf cleanup, no keep-alive withdrawn, connections cut mid-request — as when the OOM
killer or a lost node takes a pod. What must hold (docs/design.md, "Lifecycle" and "Serving"):

- one operator, killed: kube-system and the operator's namespace stay writable; an ``Ignore``
  policy stops blocking, a ``Fail`` one refuses with the API server's "failed calling webhook"
  naming our webhook; a policy can still be deleted by hand (``kubectl delete``, then removing
  the finalizer with ``kubectl patch`` — the policy webhook's ``matchConditions`` keep that patch
  away from the dead operator); restarted, it enforces again and its webhook configurations hold
  exactly the entries of the policies that exist;
- two replicas, the chart's HA shape (Kopf peering, distinct priorities, one Service in front):
  both serve admission requests, one reconciles; killing either mid-stream never produces a wrong
  decision, only failed calls on the connections the API server had open to the dead replica (it
  does not retry those — shown by the first test; a client that retries, as controllers do, gets
  the right answer), and the survivor takes over reconciliation once Kopf's peering notices the
  leader is gone (up to Kopf's peering lifetime, 60 s, which the operator does not expose).

Tests that stop the session's operator start it again in a ``finally``: the other tests and the
session teardown (which releases the policies' finalizers) need it.
"""
from __future__ import annotations

import base64
import contextlib
import dataclasses
import datetime
import ipaddress
import pathlib
import re
import socket
import ssl
import threading
from collections.abc import Callable
from typing import Any

import pykube
import pytest
import requests
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from e2e_kube import (
    FINALIZER,
    OWNED_LABEL,
    AdmissionPolicy,
    Answer,
    Cluster,
    MutatingWebhookConfiguration,
    OperatorProcess,
    Policies,
    ValidatingWebhookConfiguration,
    assert_denied,
    configmap,
    eventually,
    policy_body,
    unique,
)
from replicas import (
    BROKEN_CONNECTION,
    DOMAIN,
    EXCEPTION_WEBHOOKS,
    FAIL_WEBHOOK,
    IGNORE_WEBHOOK,
    POLICY_WEBHOOK,
    PROBE_WEBHOOK,
    TENANT_POLICY_WEBHOOK,
    TcpProxy,
    log_of,
    pauses,
    reconciled,
    replicas,
    requests_judged,
    routed,
    webhooks,
)

from ports import free_ports

pytestmark = pytest.mark.e2e

# Kopf's peering default (kopf.OperatorSettings().peering.lifetime): a peer that stops touching the
# peering object counts as gone this long after its last keep-alive. The operator does not expose
# it, so a takeover after a SIGKILL may take this long.
KOPF_PEERING_LIFETIME = 60.0


# --- objects ------------------------------------------------------------------------------------------------

def rule(resource: str, *operations: str) -> dict[str, Any]:
    return {"apiGroups": [""], "apiVersions": ["v1"], "resources": [resource],
            "operations": list(operations or ("CREATE", "UPDATE"))}


def name_guard(name: str, resource: str, failure_policy: str, prefix: str = "forbidden-",
               message: str | None = None) -> dict[str, Any]:
    """A policy refusing ``resource`` objects whose name starts with ``prefix``."""
    body: dict[str, Any] = policy_body(
        name, failurePolicy=failure_policy, match={"resources": [rule(resource)]},
        validations=[{"expression": f"!object.metadata.name.startsWith('{prefix}')",
                      "message": message or f"{resource} names must not start with {prefix}",
                      "reason": "Forbidden"}])
    return body


def secret(namespace: str, name: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": name, "namespace": namespace},
            "stringData": {"e2e": "yes"}}


def failed_call(answer: Answer, webhook: str) -> bool:
    """Refused because the API server could not call ``webhook`` (not because the webhook said no)."""
    return (answer.status == 500 and f'failed calling webhook "{webhook}"' in answer.message)


# --- 1. what the API server does when a webhook call fails -------------------------------------------------

def url_host(host: str) -> str:
    return f"[{host}]" if ":" in host else host


def _self_signed(directory: pathlib.Path, host: str) -> tuple[pathlib.Path, pathlib.Path]:
    """A certificate for ``host`` and its key, as files; the certificate is its own CA."""
    try:
        san: x509.GeneralName = x509.IPAddress(ipaddress.ip_address(host))
    except ValueError:
        san = x509.DNSName(host)
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "e2e-failing-webhook")])
    now = datetime.datetime.now(datetime.UTC)
    certificate = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
                   .serial_number(x509.random_serial_number())
                   .not_valid_before(now - datetime.timedelta(minutes=5))
                   .not_valid_after(now + datetime.timedelta(hours=1))
                   .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
                   .add_extension(x509.SubjectAlternativeName([san]), critical=False)
                   .sign(key, hashes.SHA256()))
    cert_file, key_file = directory / "tls.crt", directory / "tls.key"
    cert_file.write_bytes(certificate.public_bytes(serialization.Encoding.PEM))
    key_file.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    return cert_file, key_file


class ResettingWebhook:
    """A TLS endpoint that reads each admission request in full, then resets the connection.

    That is what the API server sees of a webhook process killed while deciding: the request was
    sent, no answer comes, the connection breaks. Counting connections and requests tells whether
    the API server sends the request again.
    """

    def __init__(self, directory: pathlib.Path, host: str) -> None:
        self.cert_file, key_file = _self_signed(directory, host)
        self.context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        self.context.load_cert_chain(self.cert_file, key_file)
        self.listener = socket.create_server(("", 0))   # where the API server reaches it: the advertise host
        self.listener.settimeout(0.2)
        self.port = int(self.listener.getsockname()[1])
        self.connections = 0
        self.requests = 0
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._serve, name="e2e-resetting-webhook", daemon=True)

    @property
    def ca_bundle(self) -> str:
        return base64.b64encode(self.cert_file.read_bytes()).decode()

    def __enter__(self) -> ResettingWebhook:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stopping.set()
        self._thread.join(10)
        self.listener.close()

    def _serve(self) -> None:
        while not self._stopping.is_set():
            try:
                raw, _ = self.listener.accept()
            except TimeoutError:
                continue
            self.connections += 1
            with contextlib.suppress(OSError), raw:
                raw.settimeout(5)
                with self.context.wrap_socket(raw, server_side=True) as tls:
                    if self._read_request(tls):
                        self.requests += 1
                    # SO_LINGER 0: close() sends a RST, as the kernel does for a killed process's socket
                    # with unread data.
                    tls.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")

    @staticmethod
    def _read_request(tls: ssl.SSLSocket) -> bool:
        data = b""
        while b"\r\n\r\n" not in data:
            chunk = tls.recv(65536)
            if not chunk:
                return False
            data += chunk
        head, _, body = data.partition(b"\r\n\r\n")
        match = re.search(rb"(?im)^content-length:\s*(\d+)", head)
        length = int(match.group(1)) if match else 0
        while len(body) < length:
            chunk = tls.recv(65536)
            if not chunk:
                return False
            body += chunk
        return True


def test_the_api_server_does_not_retry_a_webhook_call_whose_connection_breaks(
        cluster: Cluster, namespace: Callable[..., str], tmp_path: pathlib.Path) -> None:
    """What the HA test below may expect: a refused or reset webhook connection is one failed call.

    Measured, not assumed: a webhook endpoint (ours, not the operator's) reads each request and
    resets the connection; one create sends it exactly one request — the API server (client-go's
    REST client, which retries only GETs, and Go's transport, which resends only requests not yet
    written on a reused connection) does not try again, and with failurePolicy Fail the client
    gets a 500 naming the webhook. A refused connection fails the same way, at once.
    """
    ns = namespace()
    name = unique("ap-e2e-retry-probe")
    webhook_name = f"retry-probe.{DOMAIN}"
    host = cluster.settings.advertise_host
    with ResettingWebhook(tmp_path, host) as endpoint:
        def configuration(port: int) -> dict[str, Any]:
            return {
                "apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingWebhookConfiguration",
                "metadata": {"name": name, "labels": {OWNED_LABEL: "true"}},
                "webhooks": [{
                    "name": webhook_name, "admissionReviewVersions": ["v1"], "sideEffects": "None",
                    "failurePolicy": "Fail", "timeoutSeconds": 5, "matchPolicy": "Equivalent",
                    "clientConfig": {"url": f"https://{url_host(host)}:{port}/probe",
                                     "caBundle": endpoint.ca_bundle},
                    "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": ns}},
                    "rules": [{**rule("configmaps", "CREATE"), "scope": "Namespaced"}],
                }],
            }

        created = cluster.create(ValidatingWebhookConfiguration, configuration(endpoint.port))
        assert created.ok, str(created)
        try:
            probe = configmap(ns, "retry-probe")
            # The API server's informer picks the configuration up; from then on, every create fails.
            eventually(lambda: cluster.create(pykube.ConfigMap, probe, dry_run=True),
                       lambda a: failed_call(a, webhook_name), f"the webhook {webhook_name} to be called",
                       cluster.settings.timeout)
            connections, requests_seen = endpoint.connections, endpoint.requests
            answer = cluster.create(pykube.ConfigMap, probe, dry_run=True)
            assert failed_call(answer, webhook_name) and BROKEN_CONNECTION.search(answer.message), str(answer)
            assert endpoint.requests - requests_seen == 1, (
                f"the API server sent the request {endpoint.requests - requests_seen} times: {answer}")
            assert endpoint.connections - connections == 1, f"{endpoint.connections - connections} connections"
            print(f"\nreset after the request was read: 1 request, no retry; the client got {answer.status}: "
                  f"{answer.message}")

            # Nothing listens: connection refused, the same failure.
            (closed_port,) = free_ports(1)
            current = cluster.get(ValidatingWebhookConfiguration, name).obj
            current["webhooks"] = configuration(closed_port)["webhooks"]
            replaced = cluster.call("PUT", ValidatingWebhookConfiguration, name, body=current)
            assert replaced.ok, str(replaced)
            refused = eventually(lambda: cluster.create(pykube.ConfigMap, probe, dry_run=True),
                                 lambda a: failed_call(a, webhook_name) and "connection refused" in a.message,
                                 "a refused connection to fail the call", cluster.settings.timeout)
            print(f"connection refused: the client got {refused.status}: {refused.message}")
        finally:
            cluster.delete(ValidatingWebhookConfiguration, name)


# --- 2. the only operator, killed ---------------------------------------------------------------------------

def test_a_killed_operator_leaves_the_cluster_usable_and_a_restart_picks_everything_up(
        cluster: Cluster, operator: OperatorProcess, policies: Policies, namespace: Callable[..., str]) -> None:
    ns = namespace()
    own = cluster.settings.operator_namespace
    timeout = cluster.settings.timeout
    fail_name, ignore_name, doomed_name = "e2e-kill-fail", "e2e-kill-ignore", "e2e-kill-doomed"
    # Three resources, so that each policy's routing can be told apart in the configurations.
    policies.apply(name_guard(fail_name, "configmaps", "Fail"))
    policies.apply(name_guard(ignore_name, "secrets", "Ignore"))
    policies.apply(name_guard(doomed_name, "podtemplates", "Fail"))

    assert_denied(cluster.create(pykube.ConfigMap, configmap(ns, "forbidden-cm"), dry_run=True), fail_name, code=403)
    assert_denied(cluster.create(pykube.Secret, secret(ns, "forbidden-secret"), dry_run=True), ignore_name, code=403)
    hooks = webhooks(cluster, ValidatingWebhookConfiguration)
    assert {"configmaps", "podtemplates"} <= routed(hooks).get(FAIL_WEBHOOK, set()), routed(hooks)
    assert "secrets" in routed(hooks).get(IGNORE_WEBHOOK, set()), routed(hooks)
    failure_policies = {hook["name"]: hook["failurePolicy"] for hook in hooks}
    assert failure_policies[FAIL_WEBHOOK] == "Fail" and failure_policies[IGNORE_WEBHOOK] == "Ignore", failure_policies

    try:
        assert operator.kill() == -9
        assert not operator.alive()

        # kube-system and the operator's namespace: create, update, delete — whatever the policies say.
        for exempt_namespace in ("kube-system", own):
            for cls, body in ((pykube.ConfigMap, configmap), (pykube.Secret, secret)):
                name = unique("forbidden-e2e-killed")
                answer = cluster.create(cls, body(exempt_namespace, name))
                assert answer.ok, f"operator killed: a {cls.kind} create in {exempt_namespace} was blocked: {answer}"
                answer = cluster.merge_patch(cls, name, {"metadata": {"labels": {"updated": "yes"}}},
                                             namespace=exempt_namespace)
                assert answer.ok, f"operator killed: a {cls.kind} update in {exempt_namespace} was blocked: {answer}"
                answer = cluster.delete(cls, name, exempt_namespace)
                assert answer.ok, f"operator killed: a {cls.kind} delete in {exempt_namespace} was blocked: {answer}"

        # Elsewhere: the Ignore policy's webhook fails open, the Fail one closed, saying why.
        skipped = cluster.create(pykube.Secret, secret(ns, "forbidden-while-killed"), dry_run=True)
        assert skipped.ok, f"the Ignore policy still blocks while the operator is dead: {skipped}"
        refused = cluster.create(pykube.ConfigMap, configmap(ns, "harmless-while-killed"), dry_run=True)
        assert failed_call(refused, FAIL_WEBHOOK), f"expected the dead Fail webhook to refuse: {refused}"
        assert operator.url in refused.message and BROKEN_CONNECTION.search(refused.message), refused.message

        # A spec edit needs the policy webhook, which is dead and fails closed ...
        new_message = "configmap names must not start with forbidden- (edited)"
        edit = {"spec": {"validations": [{"expression": "!object.metadata.name.startsWith('forbidden-')",
                                          "message": new_message, "reason": "Forbidden"}]}}
        refused_edit = cluster.merge_patch(AdmissionPolicy, fail_name, edit)
        assert failed_call(refused_edit, POLICY_WEBHOOK), f"a spec edit passed the dead policy webhook: {refused_edit}"

        # ... but deleting a policy does not: what a user types. `kubectl delete` waits for the
        # object to go, which it never does without the operator; the user stops waiting.
        cluster.kubectl("delete", "ap", doomed_name, "--wait=false")
        doomed = cluster.get(AdmissionPolicy, doomed_name).obj
        assert doomed["metadata"].get("deletionTimestamp"), doomed["metadata"]
        assert doomed["metadata"].get("finalizers") == [FINALIZER], "nothing but the operator removes the finalizer"
        # An UPDATE of a policy being deleted: the policy webhook's matchConditions skip it, so the
        # dead operator cannot refuse it (before them, this was "failed calling webhook").
        patched = cluster.kubectl("patch", "ap", doomed_name, "--type=json",
                                  "-p", '[{"op":"remove","path":"/metadata/finalizers"}]', check=False)
        assert patched.returncode == 0, f"removing the finalizer by hand failed:\n{patched.stdout}{patched.stderr}"
        cluster.wait_gone(AdmissionPolicy, doomed_name)
    finally:
        if not operator.alive():
            operator.start()  # waits until ready and the API server reaches it again

    # Restarted: the edit that was refused passes, and the new generation goes Active.
    edited = cluster.merge_patch(AdmissionPolicy, fail_name, edit)
    assert edited.ok, f"the spec edit is refused by the restarted operator: {edited}"
    assert policies.wait_active(fail_name)["metadata"]["generation"] == 2
    policies.wait_active(ignore_name)
    denied = eventually(lambda: cluster.create(pykube.ConfigMap, configmap(ns, "forbidden-again"), dry_run=True),
                        lambda a: new_message in a.message, "the edited Fail policy to be enforced", timeout)
    assert_denied(denied, fail_name, new_message, code=403)
    assert_denied(cluster.create(pykube.Secret, secret(ns, "forbidden-again"), dry_run=True), ignore_name, code=403)

    # The configurations: exactly the expected webhooks, each once, and nothing of the deleted policy.
    def settled(hooks: tuple[list[dict[str, Any]], list[dict[str, Any]]]) -> bool:
        return "podtemplates" not in routed(hooks[0]).get(FAIL_WEBHOOK, set())

    validating_hooks, mutating_hooks = eventually(
        lambda: (webhooks(cluster, ValidatingWebhookConfiguration), webhooks(cluster, MutatingWebhookConfiguration)),
        settled, "the deleted policy's podtemplates to leave the configurations", timeout)
    names = [hook["name"] for hook in validating_hooks]
    validate_exceptions, mutate_exceptions = EXCEPTION_WEBHOOKS
    assert sorted(names) == sorted([POLICY_WEBHOOK, TENANT_POLICY_WEBHOOK, validate_exceptions, FAIL_WEBHOOK,
                                    IGNORE_WEBHOOK, PROBE_WEBHOOK]), names
    # No policy mutates: the mutating configuration holds only the fixed exception entry.
    assert [hook["name"] for hook in mutating_hooks] == [mutate_exceptions], routed(mutating_hooks)
    assert routed(mutating_hooks) == {mutate_exceptions: {"admissionpolicyexceptions"}}
    by_name = {hook["name"]: hook for hook in validating_hooks}
    assert routed(validating_hooks) == {POLICY_WEBHOOK: {"admissionpolicies"},
                                        TENANT_POLICY_WEBHOOK: {"namespacedadmissionpolicies"},
                                        validate_exceptions: {"admissionpolicyexceptions"},
                                        FAIL_WEBHOOK: {"configmaps"},
                                        IGNORE_WEBHOOK: {"secrets"},
                                        PROBE_WEBHOOK: {"events"}}, routed(validating_hooks)
    assert by_name[FAIL_WEBHOOK]["failurePolicy"] == "Fail"
    assert by_name[IGNORE_WEBHOOK]["failurePolicy"] == "Ignore"
    for hook in [*validating_hooks, *mutating_hooks]:
        assert hook["clientConfig"]["url"].startswith(operator.url), hook["clientConfig"]


# --- 3. two replicas, and either one killed -----------------------------------------------------------------

@dataclasses.dataclass
class Stream:
    """A steady, bounded stream of dry-run ConfigMap creates that a policy judges, from a few threads.

    Every other name starts with ``deny-``, which the policy refuses. Each answer is counted as what
    the policy says, a wrong decision, a failed webhook call (the API server lost its connection to
    a replica), or any other error. A request whose call failed is sent again, as a controller
    requeues a failed write, until it gets an answer (a few times at most); that must be the right one.
    """
    cluster: Cluster
    namespace: str
    policy: str
    threads: int = 3
    per_thread: int = 100
    resends: int = 5
    sent: int = 0
    as_policy_says: int = 0
    wrong: list[str] = dataclasses.field(default_factory=list)
    failed_calls: list[str] = dataclasses.field(default_factory=list)
    resent: int = 0
    errors: list[str] = dataclasses.field(default_factory=list)
    _lock: threading.Lock = dataclasses.field(default_factory=threading.Lock)

    @property
    def total(self) -> int:
        return self.threads * self.per_thread

    def run(self, midway: Callable[[], None], at: float = 0.35) -> None:
        """Send everything; call ``midway`` (from this thread) once ``at`` of the stream was sent."""
        workers = [threading.Thread(target=self._send_all, args=(index,), name=f"e2e-stream-{index}")
                   for index in range(self.threads)]

        def far_enough(sent: int) -> bool:
            return sent >= at * self.total or not any(worker.is_alive() for worker in workers)

        for worker in workers:
            worker.start()
        try:
            eventually(lambda: self.sent, far_enough, f"{at:.0%} of the stream to be sent",
                       self.cluster.settings.timeout, interval=0.02)
            midway()
        finally:
            for worker in workers:
                worker.join()

    def summary(self) -> str:
        return (f"{self.sent} requests sent, {self.as_policy_says} answered as the policy says "
                f"({self.resent} of them sent again), {len(self.wrong)} wrong decisions, "
                f"{len(self.failed_calls)} failed webhook calls returned to the client, "
                f"{len(self.errors)} other errors")

    def _send_all(self, index: int) -> None:
        client = Cluster(self.cluster.settings)   # a session per thread
        for i in range(self.per_thread):
            deny = i % 2 == 0
            name = f"{'deny' if deny else 'allow'}-{index}-{i}"
            verdict, detail = self._send(client, name, deny)
            resends = 0
            while verdict == "failed-call" and resends < self.resends:
                with self._lock:
                    self.failed_calls.append(detail)
                resends += 1
                verdict, detail = self._send(client, name, deny)
            with self._lock:
                self.sent += 1
                self.resent += int(resends > 0)
                if verdict == "right":
                    self.as_policy_says += 1
                elif verdict == "wrong":
                    self.wrong.append(detail)
                else:
                    self.errors.append(detail)

    def _send(self, client: Cluster, name: str, deny: bool) -> tuple[str, str]:
        try:
            answer = client.create(pykube.ConfigMap, configmap(self.namespace, name), dry_run=True)
        except requests.RequestException as exc:
            return "error", f"{name}: {exc!r}"
        denied_by_policy = answer.status == 403 and f'AdmissionPolicy "{self.policy}" denied' in answer.message
        if (deny and denied_by_policy) or (not deny and answer.ok):
            return "right", ""
        if answer.ok or denied_by_policy:
            return "wrong", f"{name}: {answer}"
        if failed_call(answer, FAIL_WEBHOOK) and BROKEN_CONNECTION.search(answer.message):
            return "failed-call", f"{name}: {answer}"
        return "error", f"{name}: {answer}"


def test_two_replicas_both_serve_one_reconciles_and_either_can_die(
        cluster: Cluster, operator: OperatorProcess, policies: Policies, namespace: Callable[..., str],
        tmp_path: pathlib.Path, request: pytest.FixtureRequest) -> None:
    ns = namespace()
    timeout = cluster.settings.timeout
    stream_policy = "e2e-ha-stream"

    # The chart's HA shape: the peering CRD and a ClusterKopfPeering, two replicas with distinct
    # priorities (the lower one pauses), the API server reaching them through one proxy.
    with replicas(cluster, operator, tmp_path, request) as group:
        leader, follower = group.processes
        leader_pod, follower_pod = group.pod(leader), group.pod(follower)
        proxy = group.proxy

        # One reconciles: only the leader handles a new policy; both load it and serve it.
        policies.apply(name_guard(stream_policy, "configmaps", "Fail", prefix="deny-"))
        assert reconciled(leader, stream_policy), "the leader did not reconcile the new policy"
        assert not reconciled(follower, stream_policy), "the paused replica reconciled too"
        for replica in group.processes:
            assert f"AdmissionPolicy {stream_policy}: generation 1 loaded" in log_of(replica)
        for cls in (ValidatingWebhookConfiguration, MutatingWebhookConfiguration):
            for hook in webhooks(cluster, cls):
                assert hook["clientConfig"]["url"].startswith(f"{leader.url}/"), hook

        # Killing the follower mid-stream: the leader answers the rest.
        kill_mid_stream(cluster, ns, stream_policy, proxy, follower, f"{follower_pod} (the follower)")
        assert requests_judged(leader, stream_policy) > 0, "the leader never served a request of the stream"

        # The follower back (a new pod), paused again; then the leader is killed mid-stream.
        follower.start()
        eventually(lambda: pauses(follower), lambda n: n >= 2, f"{follower_pod} to pause again", timeout)
        kill_mid_stream(cluster, ns, stream_policy, proxy, leader, f"{leader_pod} (the leader)")
        assert requests_judged(follower, stream_policy) > 0, "the survivor did not serve the stream"

        # The survivor takes reconciliation over once the leader's keep-alive expires.
        successor = "e2e-ha-after-takeover"
        policies.names.append(successor)
        created = cluster.create(AdmissionPolicy, name_guard(successor, "secrets", "Fail"))
        assert created.ok, str(created)
        eventually(lambda: cluster.get(AdmissionPolicy, successor),
                   lambda a: (a.obj.get("status") or {}).get("phase") == "Active",
                   f"{successor} to go Active once {follower_pod} took over", KOPF_PEERING_LIFETIME + timeout)
        assert "Resuming operations after the pause" in log_of(follower)
        assert reconciled(follower, successor)
        assert_denied(cluster.create(pykube.Secret, secret(ns, "forbidden-after-takeover"), dry_run=True),
                      successor, code=403)
        assert_denied(cluster.create(pykube.ConfigMap, configmap(ns, "deny-after-takeover"), dry_run=True),
                      stream_policy, code=403)


def kill_mid_stream(cluster: Cluster, namespace: str, policy: str, proxy: TcpProxy, victim: OperatorProcess,
                    who: str) -> Stream:
    """Kill ``victim`` with SIGKILL a third into a stream ``policy`` judges; check what the clients got.

    Never a wrong decision, never an error other than a failed webhook call; and failed calls only
    on connections the API server already had to the victim when it died (requests in flight, or
    sent on a pooled connection before the API server saw it close): the API server does not retry
    those (see the first test), while every new connection goes to the survivor. A request whose
    call failed gets the right answer when sent again.
    """
    stream = Stream(cluster, namespace, policy)
    port = victim.listen_port
    at_kill: dict[str, int] = {}

    def kill() -> None:
        at_kill["served"] = requests_judged(victim, policy)
        at_kill["open"], at_kill["connections"] = proxy.open[port], proxy.connections[port]
        assert victim.kill() == -9

    stream.run(kill)
    # Connections it took between the snapshot and its death; none after (it refuses, the proxy skips it).
    exposed = at_kill["open"] + proxy.connections[port] - at_kill["connections"]
    summary = f"killing {who} mid-stream: {stream.summary()}"
    print(f"\n{summary}; {exposed} API server connection(s) open to it when it died; "
          f"proxy: connections {dict(proxy.connections)}, refused {dict(proxy.refused)}")
    for call in stream.failed_calls:
        print(f"  failed call: {call}")
    assert at_kill["served"] > 0, f"{who} served no request of the stream before it was killed"
    assert proxy.unserved == 0, f"{proxy.unserved} connection(s) found no replica, though one was alive"
    assert stream.sent == stream.total, summary
    assert stream.wrong == [], f"{summary}; wrong decisions: {stream.wrong[:5]}"
    assert stream.errors == [], f"{summary}; errors: {stream.errors[:5]}"
    assert stream.as_policy_says == stream.total, summary
    assert len(stream.failed_calls) <= exposed, (f"{summary}: more failed calls than connections to the killed "
                                                 f"replica ({exposed}): {stream.failed_calls}")
    assert all(f"{victim.url}/validate" in call for call in stream.failed_calls), stream.failed_calls
    return stream

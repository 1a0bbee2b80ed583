"""Issue 12, scenario 2: the webhook's certificates rotated, lost and expired while requests stream in.

The operator keeps its CA and serving certificate in one Secret that every replica shares, and
writes the CA bundle into the webhook configurations itself (docs/design.md, "Webhook configurations"). What must hold:

- a renewal under load, with two replicas (Kopf peering, one address in front as the Service is):
  no request fails — in particular no TLS handshake, which the API server would return as "failed
  calling webhook ... x509" — and none is judged wrongly. Checked from both sides: every answer the
  clients get, and, sampled all along, that the certificate each replica serves was issued by a CA
  that the API server holds in *both* configurations' ``caBundle`` (the old and the new CA together
  across the switch);
- the Secret deleted by hand while they run: recreated without an admin, the traffic unharmed;
- a CA that has already expired when the operator starts (the operator was down for months): the
  operator issues a new one, the configurations trust it, and the traffic is answered again.

``AP_CERT_LIFETIME=30`` makes the serving certificate last 30 s (its CA 60 s) so that a renewal —
due with a third of the lifetime left — happens within ~20 s of issuance.
"""
from __future__ import annotations

import base64
import contextlib
import dataclasses
import datetime
import pathlib
import socket
import ssl
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import pykube
import pytest
from cryptography import x509
from e2e_kube import (
    OWNED_LABEL,
    Cluster,
    MutatingWebhookConfiguration,
    OperatorProcess,
    ValidatingWebhookConfiguration,
    eventually,
    unique,
)
from replicas import Replicas, replicas
from traffic import Figures, PolicyDriver, Timeline, Traffic, Variant, report, scaled

from admission_policy.config import OperatorConfig
from admission_policy.operator import certificates

pytestmark = pytest.mark.e2e

SELECTOR_KEY = "e2e.policy-operator.dev/traffic"
LIFETIME = 30            # AP_CERT_LIFETIME of the replicas under test: renewed ~20 s after issuance
SAMPLE_INTERVAL = 0.25   # how often the sampler looks at what is served and what is trusted


# --- what the replicas serve and what the API server trusts -------------------------------------------------

def key_id(cert: x509.Certificate) -> str:
    """The CA's own key id (SubjectKeyIdentifier): how a certificate names its issuer (AKI)."""
    return cert.extensions.get_extension_for_class(x509.SubjectKeyIdentifier).value.digest.hex()


def issuer_id(cert: x509.Certificate) -> str:
    aki = cert.extensions.get_extension_for_class(x509.AuthorityKeyIdentifier).value.key_identifier
    assert aki is not None, cert
    return aki.hex()


def served_certificate(port: int) -> x509.Certificate | None:
    """The certificate a replica presents to a new connection (None: nothing listens)."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE   # we look at it, the API server verifies it
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=5) as raw, \
                context.wrap_socket(raw, server_hostname="127.0.0.1") as tls:
            der = tls.getpeercert(binary_form=True)
    except OSError:
        return None
    return x509.load_der_x509_certificate(der) if der else None


def trusted_cas(cluster: Cluster) -> dict[str, frozenset[str]]:
    """Per configuration kind, the CAs (key ids) that every one of its webhooks' caBundle holds."""
    trusted: dict[str, frozenset[str]] = {}
    for cls in (ValidatingWebhookConfiguration, MutatingWebhookConfiguration):
        answer = cluster.get(cls, cluster.settings.webhook_config_name)
        hooks = (answer.obj.get("webhooks") or []) if answer.ok else []
        bundles = [frozenset(key_id(ca) for ca in x509.load_pem_x509_certificates(
            base64.b64decode(hook["clientConfig"]["caBundle"]))) for hook in hooks]
        if bundles:   # no configuration: nothing is called, nothing to trust
            trusted[cls.kind] = frozenset.intersection(*bundles)
    return trusted


def secret_bundle(cluster: Cluster, namespace: str, name: str) -> certificates.CertificateBundle | None:
    answer = cluster.get(pykube.Secret, name, namespace)
    if not answer.ok:
        return None
    return certificates.bundle_from_secret_data(answer.obj.get("data") or {})


def ca_id(bundle: certificates.CertificateBundle) -> str:
    return key_id(x509.load_pem_x509_certificate(bundle.ca_cert_pem.encode()))


@dataclasses.dataclass(frozen=True)
class Sample:
    at: float
    served: Mapping[str, str]               # replica → the key id of the CA that issued what it serves
    trusted: Mapping[str, frozenset[str]]   # configuration kind → CAs in its caBundle
    secret_ca: str | None                   # the Secret's current CA (None: the Secret is gone)


class Sampler:
    """A thread that records, every ``SAMPLE_INTERVAL``, what each replica serves and what the API server
    trusts, until stopped. A sample where a served certificate's CA is missing from a caBundle is a
    moment when the API server would have refused the handshake."""

    def __init__(self, cluster: Cluster, replicas: Mapping[str, OperatorProcess], secret: str) -> None:
        self.cluster, self.replicas, self.secret = Cluster(cluster.settings), replicas, secret
        self.samples: list[Sample] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="e2e-cert-sampler", daemon=True)
        self._failure: BaseException | None = None

    def __enter__(self) -> Sampler:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join(30)
        if self._failure is not None:
            raise AssertionError(f"the sampler failed: {self._failure!r}") from self._failure

    def _run(self) -> None:
        namespace = self.cluster.settings.operator_namespace
        try:
            while not self._stop.wait(SAMPLE_INTERVAL):
                served = {pod: issuer_id(cert) for pod, replica in self.replicas.items()
                          if (cert := served_certificate(replica.listen_port)) is not None}
                trusted = trusted_cas(self.cluster)
                bundle = secret_bundle(self.cluster, namespace, self.secret)
                self.samples.append(Sample(time.monotonic(), served, trusted,
                                           ca_id(bundle) if bundle is not None else None))
        except BaseException as exc:   # reported on exit, not lost in a thread
            self._failure = exc

    def untrusted(self) -> list[str]:
        """Every moment a replica served a certificate that a configuration's caBundle did not trust."""
        return [f"at {s.at:.2f}: {pod} serves a certificate of CA {ca[:12]}, {kind} trusts "
                f"{sorted(c[:12] for c in cas)}"
                for s in self.samples for pod, ca in s.served.items() for kind, cas in s.trusted.items()
                if ca not in cas]

    def serving(self, ca: str) -> bool:
        """The last sample shows every replica serving a certificate of ``ca``."""
        return bool(self.samples) and all(self.samples[-1].served.get(pod) == ca for pod in self.replicas)


# --- two replicas sharing the Secret ------------------------------------------------------------------------

@contextlib.contextmanager
def replicas_sharing(cluster: Cluster, operator: OperatorProcess, tmp_path: pathlib.Path,
                     request: pytest.FixtureRequest, secret: str, env: Mapping[str, str], count: int,
                     start: bool = True) -> Iterator[Replicas]:
    """``count`` replicas with their own Secret, instead of the session's operator (which writes the
    same webhook configurations); with two, the chart's HA shape: Kopf peering, distinct priorities,
    a TCP proxy in front as the Service is. The Secret is deleted once they are stopped."""
    try:
        with replicas(cluster, operator, tmp_path, request, count, peering=count > 1, proxy=count > 1,
                      env={"AP_CERT_SECRET": secret, **env}, prefix="ap-e2e-cert", start=start) as group:
            yield group
    finally:
        cluster.delete(pykube.Secret, secret, cluster.settings.operator_namespace)


def traffic_denial(cluster: Cluster, namespace: Callable[..., str]) -> tuple[str, PolicyDriver]:
    """A namespace for the traffic, and a driver with a tagged policy that denies all of it."""
    selector = (SELECTOR_KEY, unique("certs"))
    ns = namespace({selector[0]: selector[1]})
    driver = PolicyDriver(cluster, Timeline(), selector)
    driver.write(unique("cert-deny"), Variant("Enforce"))
    return ns, driver


def tls_failures(answers: list[Any]) -> int:
    """Answers where the API server could not complete a TLS handshake with a replica."""
    return sum(1 for a in answers if a.error and any(s in a.message for s in ("x509", "tls:", "handshake")))


# --- the scenarios ------------------------------------------------------------------------------------------

def test_renewal_and_a_deleted_secret_under_load_with_two_replicas(
        cluster: Cluster, operator: OperatorProcess, namespace: Callable[..., str], tmp_path: pathlib.Path,
        request: pytest.FixtureRequest) -> None:
    timeout = cluster.settings.timeout
    own = cluster.settings.operator_namespace
    secret = unique("ap-e2e-rotation-tls")
    with replicas_sharing(cluster, operator, tmp_path, request, secret, {"AP_CERT_LIFETIME": str(LIFETIME)},
                          2) as group:
        pods = group.pods
        ns, driver = traffic_denial(cluster, namespace)
        try:
            with Sampler(cluster, pods, secret) as sampler, \
                    Traffic(cluster, ns, clients=4) as traffic:
                traffic.wait(20, timeout)
                started = time.monotonic()
                bundle = secret_bundle(cluster, own, secret)
                assert bundle is not None, f"Secret {own}/{secret} missing"
                before = ca_id(bundle)

                # 1. A renewal, due ~20 s after issuance, while the traffic flows; then both replicas
                # serve the new certificate (the old one stays trusted until then).
                renewed = eventually(lambda: secret_bundle(cluster, own, secret),
                                     lambda b: b is not None and ca_id(b) != before,
                                     "the Secret to be renewed", LIFETIME + timeout, interval=0.2)
                assert renewed is not None
                renewal_seen = time.monotonic()
                eventually(lambda: sampler.serving(ca_id(renewed)), bool,
                           "both replicas to serve the renewed certificate", LIFETIME, interval=0.2)
                switched = time.monotonic() - renewal_seen
                traffic.wait(scaled(200), timeout)

                # 2. The Secret deleted by hand: recreated by a replica, then served by both.
                current = secret_bundle(cluster, own, secret)
                assert current is not None
                cluster.delete(pykube.Secret, secret, own)
                deleted = time.monotonic()
                recreated = eventually(lambda: secret_bundle(cluster, own, secret),
                                       lambda b: b is not None and ca_id(b) != ca_id(current),
                                       "the deleted Secret to be recreated", timeout, interval=0.2)
                assert recreated is not None
                recreated_after = time.monotonic() - deleted
                eventually(lambda: sampler.serving(ca_id(recreated)), bool,
                           "both replicas to serve the recreated Secret's certificate", LIFETIME, interval=0.2)
                traffic.wait(scaled(200), timeout)
                while len(traffic.answers) < scaled(1500) and time.monotonic() - started < LIFETIME:
                    time.sleep(0.2)
            answers = traffic.answers
        finally:
            driver.delete_all()   # while the replicas run: the leader releases the finalizer

    # What the API server held across the switches: old and new CA side by side, never a served
    # certificate it did not trust.
    cas_held = [len(cas) for s in sampler.samples for cas in s.trusted.values()]
    both_held = [s for s in sampler.samples
                 if any({before, ca_id(renewed)} <= cas for cas in s.trusted.values())]
    figures = report(Figures.of(
        "certificate rotation under load (2 replicas)", answers, driver.timeline,
        tls_failures=tls_failures(answers), renewal_to_both_serving_s=switched,
        secret_recreated_after_s=recreated_after, samples=len(sampler.samples), max_cas_in_bundle=max(cas_held)))
    # Each replica trusts the other's renewal as soon as the Secret changes: were it to write its
    # older caBundle back, the two would overwrite each other until its next check of the Secret.
    fights = [f"{pod}: {line}" for pod, replica in pods.items()
              for line in replica.log_path.read_text(errors="replace").splitlines()
              if "changed outside the operator" in line]
    assert not fights, "the replicas overwrote each other's webhook configurations:\n" + "\n".join(fights[:10])
    untrusted = sampler.untrusted()
    assert not untrusted, "a replica served a certificate the API server did not trust:\n" + "\n".join(untrusted[:10])
    assert both_held, "the caBundle never held the old and the new CA together"
    assert renewed.previous_ca_pems and bundle.ca_cert_pem in renewed.previous_ca_pems, "the old CA was dropped"
    assert current.ca_cert_pem in recreated.previous_ca_pems, "the recreated Secret dropped the CA in use"
    assert figures.wrong == 0, "\n".join([figures.line(), *figures.wrong_examples])
    assert figures.errors == 0, "\n".join([figures.line(), *(str(a) for a in answers if a.error)][:10])
    assert sum(1 for a in answers if a.tags()) == figures.right, "the policy judged only part of the traffic"


def expired_bundle(cluster: Cluster) -> certificates.CertificateBundle:
    """A CA and serving certificate for this host, issued long enough ago that both have expired."""
    settings = OperatorConfig(namespace=cluster.settings.operator_namespace,
                                advertise_host=cluster.settings.advertise_host)
    issued = datetime.datetime.now(datetime.UTC) - certificates.CA_LIFETIME - datetime.timedelta(days=1)
    return certificates.generate_bundle(certificates.serving_hosts(settings), issued)


def test_a_ca_expired_before_the_operator_starts_is_replaced_without_an_admin(
        cluster: Cluster, operator: OperatorProcess, namespace: Callable[..., str], tmp_path: pathlib.Path,
        request: pytest.FixtureRequest) -> None:
    """The operator was down past its CA's expiry: the Secret and the configurations both hold the
    expired CA (kyverno#13639). Started, it must recover by itself."""
    timeout = cluster.settings.timeout
    own = cluster.settings.operator_namespace
    secret = unique("ap-e2e-expired-tls")
    expired = expired_bundle(cluster)
    assert expired.not_after < datetime.datetime.now(datetime.UTC)
    with replicas_sharing(cluster, operator, tmp_path, request, secret, {}, 1, start=False) as group:
        created = cluster.create(pykube.Secret, {
            "apiVersion": "v1", "kind": "Secret", "type": "kubernetes.io/tls",
            "metadata": {"name": secret, "namespace": own, "labels": {OWNED_LABEL: "true"}},
            "data": certificates.bundle_to_secret_data(expired)})
        assert created.ok, str(created)
        # What the configurations held when that operator stopped: its CA only.
        stale = base64.b64encode(expired.ca_bundle.encode()).decode()
        for cls in (ValidatingWebhookConfiguration, MutatingWebhookConfiguration):   # both hold a webhook
            configuration = cluster.get(cls, cluster.settings.webhook_config_name).obj
            for hook in configuration["webhooks"]:
                hook["clientConfig"]["caBundle"] = stale
            replaced = cluster.call("PUT", cls, configuration["metadata"]["name"], body=configuration)
            assert replaced.ok, str(replaced)

        started = time.monotonic()
        group.start()
        recovered = time.monotonic() - started   # start() returns once the API server reaches it
        (replica,) = group.processes
        ns, driver = traffic_denial(cluster, namespace)
        try:
            with Traffic(cluster, ns, clients=4, limit=scaled(400)) as traffic:
                answers = traffic.wait_finished(timeout)
            bundle = secret_bundle(cluster, own, secret)
            served = served_certificate(replica.listen_port)
            trusted = trusted_cas(cluster)
        finally:
            driver.delete_all()

    figures = report(Figures.of("CA expired before the operator started", answers, driver.timeline,
                                start_to_reachable_s=recovered))
    now = datetime.datetime.now(datetime.UTC)
    assert bundle is not None and served is not None
    assert bundle.ca_cert_pem != expired.ca_cert_pem
    assert expired.ca_cert_pem not in bundle.previous_ca_pems, "an expired CA was kept in the bundle"
    hosts = certificates.serving_hosts(OperatorConfig(namespace=own, advertise_host=cluster.settings.advertise_host))
    assert not bundle.needs_renewal(now, hosts), "the Secret's new certificates are not valid for long"
    assert issuer_id(served) == ca_id(bundle), "the replica does not serve the Secret's certificate"
    assert all(cas == {ca_id(bundle)} for cas in trusted.values()), f"caBundle: {trusted}"
    assert figures.wrong == 0, "\n".join([figures.line(), *figures.wrong_examples])
    assert figures.errors == 0, "\n".join([figures.line(), *(str(a) for a in answers if a.error)][:10])
    assert figures.right == len(answers) and all(a.denied for a in answers), figures.line()

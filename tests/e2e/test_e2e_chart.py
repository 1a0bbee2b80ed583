"""The Helm chart against a real API server: its manifests are accepted, and its RBAC is enough.

tests/chart renders the chart offline and schema-checks every object; only an API server can say
whether it would really accept them (CRD structural rules, admission, defaulting), and only a
real authorizer can say whether the ServiceAccount and roles the chart grants let the operator
do its work. So:

- every scenario's rendered manifests, hooks included, and the chart's CRDs pass
  ``kubectl apply --dry-run=server``;
- the operator runs with a token of the chart's ServiceAccount — the chart's ClusterRole, Roles
  and bindings applied for real, not admin — with Kopf peering on, as the chart runs it, through a
  whole lifecycle, and its log shows no refused call.

The session's operator makes way for the restricted one and is started again afterwards (the
session's teardown needs it). The chart's CRDs are installed as Helm does (created when missing,
never updated) and stay, like the AdmissionPolicy CRD the session applies; the RBAC objects and
the peering object this module creates are deleted.
"""
from __future__ import annotations

import contextlib
import pathlib
import re
import sys
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import helm_python as helm
import pykube
import pytest
import yaml
from e2e_kube import (
    FINALIZER,
    AdmissionPolicy,
    Answer,
    Cluster,
    ClusterKopfPeering,
    MutatingWebhookConfiguration,
    OperatorProcess,
    Policies,
    ValidatingWebhookConfiguration,
    assert_denied,
    eventually,
    policy_body,
    unique,
)
from pykube.objects import APIObject

from builders import CREATE_POD_RULE, pod

# The chart's renderer lives with the chart tests (a plain module, like this directory's e2e_kube).
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "chart"))
from chart_render import CHART_DIR, SCENARIOS, crd_documents, render

pytestmark = pytest.mark.e2e

RBAC_KINDS = ("ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding")
EVENT_NAMESPACE = "default"   # where events about cluster-scoped objects live (kubectl describe looks there)
COMPONENT = "admission-policy-operator"   # the operator's event source
IDENTITY = "e2e-chart-rbac-0"   # the operator's pod name (AP_POD_NAME) and Kopf peer id (POD_ID)

# What a refused call looks like in the operator's log: its own warnings ("cannot ...: 403 Forbidden"),
# Kopf's ("Not enough permissions ..."), kubernetes_asyncio's exceptions ("(403)", "Reason: Forbidden").
REFUSED = re.compile(r"\b40[13]\b|forbidden|unauthori[sz]ed|permission|\bcannot\b", re.IGNORECASE)
TIMESTAMP = re.compile(r"^\[[^]]*\]")

T = TypeVar("T")


@pytest.fixture(scope="module")
def chart() -> Iterator[helm.Chart]:
    with helm.Chart.load(CHART_DIR) as loaded:
        yield loaded


@pytest.fixture(scope="module")
def chart_crds(cluster: Cluster, chart: helm.Chart) -> dict[str, dict[str, Any]]:
    """The chart's CRDs installed the way Helm installs crds/: created when missing, never updated."""
    crds = crd_documents(chart)
    for name, crd in crds.items():
        if cluster.get(pykube.CustomResourceDefinition, name).status == 404:
            cluster.kubectl("create", "-f", "-", input=yaml.safe_dump(crd))
        cluster.kubectl("wait", "--for=condition=Established", f"crd/{name}", "--timeout=60s")
    return crds


# --- helpers ------------------------------------------------------------------------------------------------

def dump(docs: list[dict[str, Any]]) -> str:
    return yaml.safe_dump_all(docs, sort_keys=False)


def object_ref(doc: dict[str, Any]) -> str:
    """How kubectl names an object in its output: ``deployment.apps/NAME``, ``serviceaccount/NAME``."""
    group = doc["apiVersion"].rpartition("/")[0]
    return f"{doc['kind'].lower()}{'.' + group if group else ''}/{doc['metadata']['name']}"


def assert_dry_run_accepted(cluster: Cluster, docs: list[dict[str, Any]], what: str) -> None:
    """``kubectl apply --dry-run=server``: every object went through the API server, none stored."""
    result = cluster.kubectl("apply", "--dry-run=server", "-f", "-", input=dump(docs), check=False)
    output = result.stdout + result.stderr
    assert result.returncode == 0, f"{what}: the API server refused the dry run:\n{output}"
    accepted = {line.split()[0] for line in result.stdout.splitlines() if line.endswith("(server dry run)")}
    missing = [object_ref(doc) for doc in docs if object_ref(doc) not in accepted]
    assert not missing, f"{what}: no server dry run reported for {missing}:\n{output}"


def is_hook(doc: dict[str, Any]) -> bool:
    return "helm.sh/hook" in (doc["metadata"].get("annotations") or {})


def operator_env(docs: list[dict[str, Any]]) -> dict[str, Any]:
    """The operator container's env of the rendered Deployment (values, or valueFrom for fieldRefs)."""
    (deployment,) = [d for d in docs if d["kind"] == "Deployment"]
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container["env"]}


def token_kubeconfig(admin: pathlib.Path, token: str, namespace: str, path: pathlib.Path) -> pathlib.Path:
    """A kubeconfig with the admin's server and CA but a ServiceAccount's bearer token.

    The context namespace is the operator's, as in a pod.
    """
    config = yaml.safe_load(admin.read_text())
    context_name = config["current-context"]
    context = next(c["context"] for c in config["contexts"] if c["name"] == context_name)
    cluster = dict(next(c["cluster"] for c in config["clusters"] if c["name"] == context["cluster"]))
    ca = cluster.get("certificate-authority")
    if ca and not pathlib.Path(ca).is_absolute():  # relative to the kubeconfig it was written in
        cluster["certificate-authority"] = str((admin.parent / ca).resolve())
    path.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "chart-rbac",
        "clusters": [{"name": "e2e", "cluster": cluster}],
        "users": [{"name": "chart-rbac", "user": {"token": token}}],
        "contexts": [{"name": "chart-rbac", "context": {"cluster": "e2e", "user": "chart-rbac",
                                                         "namespace": namespace}}],
    }))
    path.chmod(0o600)
    return path


def can_i(cluster: Cluster, kubeconfig: pathlib.Path, *args: str) -> bool:
    """``kubectl auth can-i`` as the kubeconfig's user (a SelfSubjectAccessReview)."""
    result = cluster.kubectl("--kubeconfig", str(kubeconfig), "auth", "can-i", *args, check=False)
    answer = result.stdout.strip()
    assert answer in ("yes", "no"), f"kubectl auth can-i {' '.join(args)}: {result.stdout}{result.stderr}"
    return answer == "yes"


def policy_events(cluster: Cluster, policy: str) -> list[dict[str, Any]]:
    """Events about the policy where ``kubectl describe ap`` finds them."""
    answer = cluster.call("GET", pykube.Event, namespace=EVENT_NAMESPACE,
                          params={"fieldSelector": f"involvedObject.name={policy},involvedObject.kind=AdmissionPolicy"})
    return list(answer.obj.get("items") or [])


def wait_event(cluster: Cluster, op: OperatorProcess, policy: str, reason: str, uid: str) -> dict[str, Any]:
    """The policy's event with this reason, as the operator posted it: core/v1, about the cluster-scoped
    object (no involvedObject.namespace), in namespace "default"."""
    def find(events: list[dict[str, Any]]) -> bool:
        return any(e.get("reason") == reason for e in events)
    events = eventually(checked(op, lambda: policy_events(cluster, policy)), find,
                        f"a {reason} event about AdmissionPolicy {policy} in namespace {EVENT_NAMESPACE}",
                        cluster.settings.timeout)
    event = next(e for e in events if e.get("reason") == reason)
    involved = event["involvedObject"]
    assert involved.get("namespace", "") == "", f"cluster-scoped object, namespaced event: {event}"
    assert involved["apiVersion"] == AdmissionPolicy.version and involved["uid"] == uid, event
    assert (event.get("source") or {}).get("component") == COMPONENT, event
    return event


def refused_calls(op: OperatorProcess) -> list[str]:
    """The lines of the operator's log that show an API call refused (or a permission Kopf lacks)."""
    try:
        text = op.log_path.read_text(errors="replace")
    except FileNotFoundError:
        return []
    # Past the timestamp: its milliseconds may read 401 or 403.
    return [line for line in text.splitlines() if REFUSED.search(TIMESTAMP.sub("", line, count=1))]


def assert_never_refused(op: OperatorProcess) -> None:
    refused = refused_calls(op)
    assert not refused, "the operator, with the chart's RBAC, was refused API calls:\n" + "\n".join(refused)


def checked(op: OperatorProcess, produce: Callable[[], T]) -> Callable[[], T]:
    """``produce`` for :func:`eventually` that fails at once, not at the deadline, when the log shows a
    refused call: a missing grant usually means that what is awaited never happens."""
    def run() -> T:
        assert_never_refused(op)
        return produce()
    return run


def routed_resources(cluster: Cluster, cls: type[APIObject]) -> set[str]:
    """Every resource the configuration sends to the operator's webhooks (none when it is absent)."""
    configuration = cluster.get(cls, cluster.settings.webhook_config_name)
    if configuration.status == 404:
        return set()
    return {resource for webhook in configuration.obj.get("webhooks") or [] for rule in webhook.get("rules") or []
            for resource in rule.get("resources") or []}


def client_urls(cluster: Cluster, cls: type[APIObject]) -> set[str]:
    configuration = cluster.get(cls, cluster.settings.webhook_config_name)
    assert configuration.ok, f"{cls.kind} {cluster.settings.webhook_config_name} is missing: {configuration}"
    return {webhook["clientConfig"].get("url", "") for webhook in configuration.obj.get("webhooks") or []}


# --- the manifests --------------------------------------------------------------------------------------------

def test_chart_manifests_and_crds_pass_server_side_dry_run(cluster: Cluster, chart: helm.Chart,
                                                          chart_crds: dict[str, dict[str, Any]],
                                                          namespace: Callable[..., str]) -> None:
    assert set(chart_crds) == {"admissionpolicies.policy-operator.dev", "admissionpolicyexceptions.policy-operator.dev",
                               "namespacedadmissionpolicies.policy-operator.dev", "clusterkopfpeerings.kopf.dev"}
    assert_dry_run_accepted(cluster, list(chart_crds.values()), "the chart's CRDs")

    release_namespace = namespace()
    for scenario, (values, _) in SCENARIOS.items():
        docs = render(chart, values, release_namespace)
        assert any(is_hook(d) for d in docs), f"{scenario}: the uninstall hook is not rendered"
        assert_dry_run_accepted(cluster, docs, f"scenario {scenario!r} in namespace {release_namespace}")


# --- the operator with the chart's RBAC -------------------------------------------------------------------------

def test_operator_with_the_chart_rbac_is_never_refused(cluster: Cluster, operator: OperatorProcess,
                                                       chart: helm.Chart, chart_crds: dict[str, dict[str, Any]],
                                                       policies: Policies, namespace: Callable[..., str],
                                                       tmp_path: pathlib.Path) -> None:
    settings = cluster.settings
    own = settings.operator_namespace

    # The chart for the namespace and names the session's operator uses.
    docs = render(chart, {"replicaCount": 1, "webhook": {"configName": settings.webhook_config_name,
                                                         "certSecretName": settings.cert_secret}}, own)
    env = operator_env(docs)
    assert env["AP_WEBHOOK_CONFIG_NAME"] == operator.env["AP_WEBHOOK_CONFIG_NAME"]
    assert env["AP_CERT_SECRET"] == operator.env["AP_CERT_SECRET"]
    rbac = [d for d in docs if d["kind"] in RBAC_KINDS and not is_hook(d)]
    (service_account,) = [d["metadata"]["name"] for d in rbac if d["kind"] == "ServiceAccount"]
    (peering,) = [d for d in docs if d["kind"] == "ClusterKopfPeering"]
    peering_name = peering["metadata"]["name"]
    assert env["AP_PEERING_NAME"] == peering_name
    ns = namespace()

    with contextlib.ExitStack() as cleanup:   # callbacks run last-registered first, each even if one fails
        cleanup.callback(cluster.kubectl, "delete", "--ignore-not-found", "--wait=false", "-f", "-",
                         input=dump([*rbac, peering]))
        cluster.kubectl("apply", "-f", "-", input=dump([*rbac, peering]))

        # A pod gets this token by automountServiceAccountToken; the test asks for one (TokenRequest).
        token = cluster.kubectl("create", "token", service_account, "-n", own, "--duration=1h").stdout.strip()
        kubeconfig = token_kubeconfig(settings.kubeconfig, token, own, tmp_path / "chart-rbac.kubeconfig")
        whoami = cluster.kubectl("--kubeconfig", str(kubeconfig), "auth", "whoami",
                                 "-o", "jsonpath={.status.userInfo.username}")
        assert whoami.stdout.strip() == f"system:serviceaccount:{own}:{service_account}"
        # Not admin: nothing beyond the chart's grants.
        assert not can_i(cluster, kubeconfig, "create", "pods", "-n", ns)
        assert not can_i(cluster, kubeconfig, "get", "secrets", "-n", "kube-system")
        own_configuration = f"validatingwebhookconfigurations/{settings.webhook_config_name}"
        assert can_i(cluster, kubeconfig, "update", own_configuration)
        assert not can_i(cluster, kubeconfig, "delete", own_configuration)   # the uninstall hook's job
        # What nothing below provokes reliably, asked instead: a request from a namespace the watch
        # has not delivered yet makes the operator read it. Events about an exception go in its own
        # namespace, any namespace.
        assert can_i(cluster, kubeconfig, "create", "events", "-n", ns)
        assert can_i(cluster, kubeconfig, "get", f"namespaces/{ns}")

        # The session's operator makes way; it must run again for the session's teardown.
        cleanup.callback(lambda: None if operator.alive() else operator.start())
        operator.stop()
        # Startup from scratch: the certificate Secret and both configurations are created anew.
        old_secret = cluster.get(pykube.Secret, settings.cert_secret, own)
        cluster.delete(pykube.Secret, settings.cert_secret, own)
        cluster.wait_gone(pykube.Secret, settings.cert_secret, own)
        cluster.delete_webhook_configurations()

        (tmp_path / "certs").mkdir()
        restricted = OperatorProcess(
            cluster, tmp_path / "operator.log", tmp_path / "certs", kubeconfig=kubeconfig, standalone=False,
            env={"AP_PEERING_NAME": peering_name, "AP_POD_NAME": IDENTITY, "POD_ID": IDENTITY})
        cleanup.callback(restricted.stop)
        try:
            restricted.start()   # ready, and the API server calls its policy webhook
            _startup(cluster, restricted, peering_name, old_secret)
            _lifecycle(cluster, restricted, policies, ns)
            assert restricted.stop() == 0, "the operator did not exit cleanly"
            # On exit, Kopf removes its keep-alive from the peering object (a patch, allowed).
            status = cluster.get(ClusterKopfPeering, peering_name).obj.get("status") or {}
            assert IDENTITY not in status, f"the stopped operator is still a peer: {status}"
            _restart_with_a_broken_secret(cluster, restricted)
            assert restricted.stop() == 0, "the operator did not exit cleanly"
            assert_never_refused(restricted)
        except AssertionError as exc:
            raise AssertionError(f"{exc}\n--- the operator's log ({restricted.log_path}), last lines ---\n"
                                 f"{restricted.log_tail()}") from None


def _startup(cluster: Cluster, op: OperatorProcess, peering: str, old_secret: Answer) -> None:
    """Its own certificate Secret, both configurations pointing at it, a live peer."""
    settings = cluster.settings
    secret = cluster.get(pykube.Secret, settings.cert_secret, settings.operator_namespace)
    assert secret.ok, f"the certificate Secret was not created: {secret}"
    assert secret.obj["metadata"]["uid"] != (old_secret.obj["metadata"]["uid"] if old_secret.ok else None)
    # Deleted before it started, so written by it: each holds its fixed entries at least.
    for cls in (ValidatingWebhookConfiguration, MutatingWebhookConfiguration):
        urls = client_urls(cluster, cls)
        assert urls and all(url.startswith(op.url) for url in urls), f"{cls.kind} not written by it: {urls}"
    eventually(checked(op, lambda: cluster.get(ClusterKopfPeering, peering)),
               lambda a: a.ok and IDENTITY in (a.obj.get("status") or {}),
               f"the operator's keep-alive in ClusterKopfPeering {peering}", settings.timeout)


def _lifecycle(cluster: Cluster, op: OperatorProcess, policies: Policies, ns: str) -> None:
    """A policy created → Active, enforced, edited, deleted — reconciled and served by ``op``."""
    settings = cluster.settings
    timeout = settings.timeout
    name = unique("e2e-chart-rbac")

    def sample(pod_name: str) -> dict[str, Any]:
        return pod(pod_name, namespace=ns, images=[settings.pod_image])

    def phase_of(generation: int) -> Callable[[Answer], bool]:
        return lambda a: (a.ok and (a.obj.get("status") or {}).get("observedGeneration") == generation
                          and a.obj["status"].get("phase") in ("Active", "Failed", "Degraded"))

    # Created → Active: finalizer, status, an event where kubectl describe finds it.
    policies.names.append(name)   # deleted after the test, should it fail half-way
    created = cluster.create(AdmissionPolicy, policy_body(
        name, enforcement="Enforce", match={"resources": [CREATE_POD_RULE]},
        validations=[{"expression": "!object.metadata.name.startsWith('blocked-')",
                      "message": "pod names must not start with blocked-"}]))
    assert created.ok, str(created)
    eventually(checked(op, lambda: cluster.get(AdmissionPolicy, name)), phase_of(1), f"{name} to settle", timeout)
    active = policies.wait_active(name)   # Active, or fails saying what it is
    uid = active["metadata"]["uid"]
    assert FINALIZER in active["metadata"].get("finalizers", []), active["metadata"]
    ready = {c["type"]: c for c in active["status"]["conditions"]}["Ready"]
    assert ready["status"] == "True", active["status"]
    wait_event(cluster, op, name, "Active", uid)

    # Enforced: a real (not dry-run) denial, which the operator counts and reports as an event.
    eventually(checked(op, lambda: cluster.create(pykube.Pod, sample("blocked-probe"), dry_run=True)),
               lambda a: not a.ok, "the policy to be enforced", timeout)
    denied = cluster.create(pykube.Pod, sample("blocked-pod"))
    assert_denied(denied, name, "pod names must not start with blocked-", code=403)

    # Edited: a new generation, Active again, the new rule enforced.
    edit = cluster.merge_patch(AdmissionPolicy, name, {"spec": {"validations": [
        {"expression": "!object.metadata.name.startsWith('banned-')",
         "message": "pod names must not start with banned-"}]}})
    assert edit.ok, str(edit)
    eventually(checked(op, lambda: cluster.get(AdmissionPolicy, name)), phase_of(2), f"{name} to settle", timeout)
    policies.wait_active(name)
    banned = eventually(checked(op, lambda: cluster.create(pykube.Pod, sample("banned-pod"), dry_run=True)),
                        lambda a: not a.ok, "the edited policy to be enforced", timeout)
    assert_denied(banned, name, "pod names must not start with banned-", code=403)
    allowed = cluster.create(pykube.Pod, sample("blocked-but-allowed-now"), dry_run=True)
    assert allowed.ok, str(allowed)

    # The denial, aggregated: one event per interval (30 s), not one per request.
    denial = wait_event(cluster, op, name, "Denied", uid)
    assert denial["type"] == "Warning" and "denied 1 request(s)" in denial["message"], denial

    # Deleted: unrouted, the finalizer released, the configurations rewritten without it.
    assert "pods" in routed_resources(cluster, ValidatingWebhookConfiguration)
    cluster.delete(AdmissionPolicy, name)
    eventually(checked(op, lambda: cluster.get(AdmissionPolicy, name)), lambda a: a.status == 404,
               f"AdmissionPolicy {name} to be gone (the finalizer released)", timeout)
    wait_event(cluster, op, name, "Terminating", uid)
    assert "pods" not in routed_resources(cluster, ValidatingWebhookConfiguration)
    assert all(url.startswith(op.url) for url in client_urls(cluster, ValidatingWebhookConfiguration))
    after = cluster.create(pykube.Pod, sample("blocked-after-delete"), dry_run=True)
    assert after.ok, str(after)


def _restart_with_a_broken_secret(cluster: Cluster, op: OperatorProcess) -> None:
    """A restart (as in a rolling update) that finds the Secret without its CA: the operator issues
    anew and updates the Secret in place (get + update by name), then rewrites the configurations."""
    settings = cluster.settings
    own = settings.operator_namespace

    def ca_bundles() -> set[str]:
        configuration = cluster.get(ValidatingWebhookConfiguration, settings.webhook_config_name).obj
        return {w["clientConfig"]["caBundle"] for w in configuration["webhooks"]}

    before = cluster.get(pykube.Secret, settings.cert_secret, own).obj
    trusted = ca_bundles()
    broken = cluster.merge_patch(pykube.Secret, settings.cert_secret, {"data": {"ca.crt": None, "ca.key": None}},
                                 namespace=own)
    assert broken.ok, str(broken)
    op.start()
    after = cluster.get(pykube.Secret, settings.cert_secret, own).obj
    assert after["metadata"]["uid"] == before["metadata"]["uid"], "the Secret was deleted and created, not updated"
    assert {"ca.crt", "ca.key", "tls.crt", "tls.key"} <= set(after.get("data") or {}), after.get("data")
    eventually(checked(op, ca_bundles), lambda bundles: bool(bundles) and not bundles & trusted,
               "the configurations to trust the new CA", settings.timeout)

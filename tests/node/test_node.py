"""What users do with `helm` and `kubectl` on a real node, Pods running (see conftest.py).

In order, on one installation: the Pods as the chart runs them, the examples' policies judging
`kubectl` and the kubelet and the Pods they admit running, `kubectl drain`, a replica taking over,
and last `helm uninstall`.
"""
from __future__ import annotations

import copy
import os
import time
import urllib.request
from collections.abc import Iterator
from typing import Any

import helm_python as helm
import pytest
import yaml
from admissions import Admissions, stream_policy
from knode import (
    CHART,
    IMAGE_REPOSITORY,
    IMAGE_TAG,
    NAMESPACE,
    RELEASE,
    REPO,
    VALUES,
    Node,
    build_image,
    eventually,
    ready,
)

EXAMPLES = REPO / "examples"
BUSYBOX = "localhost/knode/busybox:1.35"   # a local image (the kit's): nothing is pulled
DEMO = "node-demo"
DEPLOYMENT = f"{RELEASE}-admission-policy-operator"


def policy(name: str) -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load((EXAMPLES / name / "policy.yaml").read_text())
    return loaded


def sleeper(name: str, *, labels: dict[str, str] | None = None, annotations: dict[str, str] | None = None,
            **spec: Any) -> dict[str, Any]:
    """A Pod that runs (busybox sleeping), ending at once when asked to."""
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": DEMO, "labels": labels or {}, "annotations": annotations or {}},
            "spec": {"terminationGracePeriodSeconds": 1,
                     "containers": [{"name": "main", "image": BUSYBOX, "imagePullPolicy": "Never",
                                     "command": ["sleep", "3600"]}], **spec}}


def running(cluster: Node, name: str) -> dict[str, Any]:
    def phase() -> dict[str, Any] | None:
        pod: dict[str, Any] = cluster.json("-n", DEMO, "get", "pod", name)
        return pod if pod["status"].get("phase") == "Running" and ready(pod) else None
    found: dict[str, Any] = eventually(phase, timeout=60, what=f"pod {name} running")
    return found


def active(cluster: Node, *names: str) -> None:
    for name in names:
        eventually(lambda name=name: cluster.json("get", "admissionpolicy", name).get("status", {}).get("phase")
                   == "Active", timeout=60, what=f"AdmissionPolicy {name} Active")


@pytest.fixture(scope="module")
def demo(installed: Node) -> Iterator[Node]:
    installed.kubectl("create", "namespace", DEMO)
    try:
        yield installed
    finally:
        installed.kubectl("delete", "namespace", DEMO, "--wait=false", check=False)


@pytest.fixture
def policies(demo: Node) -> Iterator[list[str]]:
    """The AdmissionPolicies a test applies, deleted after it."""
    applied: list[str] = []
    yield applied
    if applied:
        demo.kubectl("delete", "admissionpolicy", *applied, "--ignore-not-found", "--wait=true")


def apply_policies(cluster: Node, applied: list[str], *bodies: dict[str, Any]) -> None:
    cluster.apply(list(bodies))
    applied += [body["metadata"]["name"] for body in bodies]
    active(cluster, *(body["metadata"]["name"] for body in bodies))


# --- the Pods as the chart runs them ------------------------------------------------------------

def test_helm_install_runs_two_ready_replicas_unprivileged_on_a_read_only_root(installed: Node) -> None:
    pods = installed.operator_pods()
    assert len(pods) == 2 and all(ready(pod) for pod in pods), [p["metadata"]["name"] for p in pods]
    for pod in pods:
        assert all(status["restartCount"] == 0 for status in pod["status"]["containerStatuses"])   # probes green
        name = pod["metadata"]["name"]
        exec_ = ("-n", NAMESPACE, "exec", name, "--")
        assert installed.kubectl(*exec_, "id", "-u").stdout.strip() == "10001"
        touched = installed.kubectl(*exec_, "touch", "/probe", check=False)
        assert touched.returncode != 0 and "Read-only file system" in touched.stderr
        status = installed.kubectl(*exec_, "cat", "/proc/1/status").stdout
        assert "\nNoNewPrivs:\t1\n" in status        # allowPrivilegeEscalation: false
        assert "\nSeccomp:\t2\n" in status           # seccomp filter mode: RuntimeDefault
        no_pip = installed.kubectl(*exec_, "python", "-c", "import pip", check=False)
        assert no_pip.returncode != 0 and "No module named 'pip'" in no_pip.stderr


def test_metrics_are_scraped_from_the_host_at_the_pod_ip(installed: Node) -> None:
    for pod in installed.operator_pods():
        url = f"http://{pod['status']['podIP']}:8080/metrics"
        with urllib.request.urlopen(url, timeout=10) as answer:
            text = answer.read().decode()
        assert "admission_policy_policies_loaded" in text and "admission_policy_requests_total" in text


# --- the examples' policies judge kubectl and the kubelet; what they admit runs -----------------------

def test_kubectl_run_is_judged_and_the_admitted_pod_runs_mutated(demo: Node, policies: list[str]) -> None:
    apply_policies(demo, policies, policy("deny-offensive-pod-names"), policy("lifespan-toleration"))
    denied = demo.kubectl("-n", DEMO, "run", "offensive-pod", f"--image={BUSYBOX}", "--image-pull-policy=Never",
                          "--", "sleep", "3600", check=False)
    assert denied.returncode != 0
    assert 'AdmissionPolicy "deny-offensive-pod-names" denied the request' in denied.stderr
    demo.apply(sleeper("ledger-reader", labels={"acme.com/lifespan-requested": "3"}))
    pod = running(demo, "ledger-reader")
    assert {"key": "acme.com/lifespan-remaining", "operator": "Equal", "value": "14",
            "effect": "NoSchedule"} in pod["spec"]["tolerations"]


def test_the_injected_sidecar_runs_and_default_resources_apply(demo: Node, policies: list[str]) -> None:
    sidecar = policy("sidecar-injection")
    injected = sidecar["spec"]["mutations"][0]["jsonPatch"][0]["value"]
    injected.update(image=BUSYBOX, imagePullPolicy="Never", command=["sleep", "3600"])   # a local image
    apply_policies(demo, policies, sidecar, policy("default-resources"))
    demo.apply(sleeper("orders", annotations={"acme.com/inject": "true"}))
    pod = running(demo, "orders")
    assert sorted(c["name"] for c in pod["status"]["containerStatuses"] if c["ready"]) == ["log-shipper", "main"]
    for container in pod["spec"]["containers"]:   # the sidecar too: injected after, reinvoked for it
        assert container["resources"]["requests"] == {"cpu": "100m", "memory": "128Mi"}, container["name"]


def test_a_deployments_pods_are_created_by_its_replicaset_as_the_policy_says(demo: Node,
                                                                           policies: list[str]) -> None:
    apply_policies(demo, policies, policy("pod-security-baseline"))
    template = {"metadata": {"labels": {"app": "web"}}, "spec": sleeper("unused")["spec"]}
    deployment = {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "web", "namespace": DEMO},
                  "spec": {"replicas": 2, "selector": {"matchLabels": {"app": "web"}}, "template": template}}
    demo.apply(deployment)
    eventually(lambda: demo.json("-n", DEMO, "get", "deployment", "web")["status"].get("readyReplicas") == 2,
               timeout=90, what="both Pods of Deployment web ready")
    privileged = copy.deepcopy(deployment)
    privileged["metadata"]["name"] = "web-privileged"
    privileged["spec"]["template"]["spec"]["containers"][0]["securityContext"] = {"privileged": True}
    refused = demo.kubectl("apply", "-f", "-", stdin=yaml.safe_dump(privileged), check=False)
    assert refused.returncode != 0
    assert 'the Pod template of Deployment "web-privileged" would violate the policy' in refused.stderr
    demo.kubectl("-n", DEMO, "delete", "deployment", "web", "--wait=true")


def test_the_kubelets_own_status_updates_are_mutated_and_restored(demo: Node, policies: list[str]) -> None:
    """Seed 004: the kubelet reports allocatable CPU every few seconds; the policy doubles it."""
    (name,) = [node["metadata"]["name"] for node in demo.json("get", "nodes")["items"]]

    def cpu() -> str:
        value: str = demo.kubectl("get", "node", name, "-o", "jsonpath={.status.allocatable.cpu}").stdout
        return value
    real = cpu()
    doubled = str(2 * int(real))
    apply_policies(demo, policies, policy("node-cpu-overcommit"))
    eventually(lambda: cpu() == doubled, timeout=45, what=f"allocatable cpu {doubled}")
    demo.kubectl("delete", "admissionpolicy", "node-cpu-overcommit", "--wait=true")
    eventually(lambda: cpu() == real, timeout=45, what=f"allocatable cpu back to {real}")


# --- kubectl drain -----------------------------------------------------------------------------

def drain(cluster: Node, node_name: str, *selector: str, timeout: str = "20s") -> Any:
    return cluster.kubectl("drain", node_name, "--force", "--ignore-daemonsets", "--delete-emptydir-data",
                           "--grace-period=1", f"--timeout={timeout}", *selector, check=False, timeout=120)


def test_drain_cannot_evict_a_protected_pod_until_it_is_drained(demo: Node, policies: list[str]) -> None:
    """Seed 000: evictions do not send the Pod's DELETE through admission; the guard holds against
    them, and the kubelet's final DELETE of the evicted Pod goes through (it is terminating)."""
    apply_policies(demo, policies, policy("protect-drained-pods"))
    (node_name,) = [node["metadata"]["name"] for node in demo.json("get", "nodes")["items"]]
    demo.apply(sleeper("ledger-worker", labels={"acme.com/protected": "true"}))
    running(demo, "ledger-worker")
    try:
        refused = drain(demo, node_name, "--pod-selector=acme.com/protected=true")
        assert refused.returncode != 0
        assert "pod ledger-worker is protected: annotate it acme.com/drained=true" in refused.stderr
        assert running(demo, "ledger-worker")
        demo.kubectl("-n", DEMO, "annotate", "pod", "ledger-worker", "acme.com/drained=true")
        eventually(lambda: drain(demo, node_name, "--pod-selector=acme.com/protected=true").returncode == 0,
                   timeout=60, what="the drained pod evicted")
        eventually(lambda: demo.kubectl("-n", DEMO, "get", "pod", "ledger-worker", check=False).returncode != 0,
                   timeout=60, what="the evicted pod gone (not stuck Terminating)")
    finally:
        demo.kubectl("uncordon", node_name)


def test_the_disruption_budget_keeps_one_operator_replica_through_a_drain(installed: Node) -> None:
    (node_name,) = [node["metadata"]["name"] for node in installed.json("get", "nodes")["items"]]
    try:
        drained = drain(installed, node_name, "--pod-selector=app.kubernetes.io/component=operator", timeout="15s")
        assert drained.returncode != 0 and "disruption budget" in drained.stderr
        pods = installed.operator_pods()
        assert sum(1 for pod in pods if ready(pod) and not pod["metadata"].get("deletionTimestamp")) >= 1
    finally:
        installed.kubectl("uncordon", node_name)
    eventually(lambda: sum(1 for pod in installed.operator_pods() if ready(pod)) == 2, timeout=120,
               what="both replicas ready again after uncordon")


# --- replicas ----------------------------------------------------------------------------------

def leader(cluster: Node) -> str:
    """The reconciling replica: the live peer of the highest priority in the ClusterKopfPeering."""
    (peering,) = cluster.json("get", "clusterkopfpeerings")["items"]
    pods = {pod["metadata"]["name"] for pod in cluster.operator_pods() if not pod["metadata"].get("deletionTimestamp")}
    peers = {name: peer for name, peer in (peering.get("status") or {}).items() if name in pods}
    return max(peers, key=lambda name: int(peers[name]["priority"]))


def test_the_other_replica_reconciles_once_the_reconciling_pod_is_deleted(demo: Node, policies: list[str]) -> None:
    before = leader(demo)
    started = time.monotonic()
    demo.kubectl("-n", NAMESPACE, "delete", "pod", before, "--wait=false")
    body = policy("deny-offensive-pod-names")
    body["metadata"]["name"] = "after-failover"
    apply_policies(demo, policies, body)   # Active: some replica reconciled it
    took = time.monotonic() - started
    assert leader(demo) != before
    print(f"\nfailover: a policy written as the reconciling Pod was deleted went Active after {took:.1f} s")
    eventually(lambda: sum(1 for pod in demo.operator_pods() if ready(pod)) == 2, timeout=120,
               what="the Deployment back at two ready replicas")


# --- rollouts and certificate renewals under a steady stream of admissions ---------------------------

def test_rollout_restart_helm_upgrade_and_certificate_renewal_fail_no_admission(demo: Node,
                                                                               policies: list[str]) -> None:
    """Two requests a client every ~40 ms through the API server, judged by a policy, while the
    operator's Pods are replaced three times and its serving certificate renewed: every answer is
    the policy's (no webhook call failed: no refused connection, no failed TLS handshake)."""
    apply_policies(demo, policies, stream_policy(DEMO))
    secret = ("-n", NAMESPACE, "get", "secret", f"{RELEASE}-admission-policy-operator-tls",
              "-o", "jsonpath={.data.tls\\.crt}")
    phases: dict[str, str] = {}
    with Admissions(demo.kubeconfig, DEMO) as stream:
        time.sleep(2)
        demo.kubectl("-n", NAMESPACE, "rollout", "restart", f"deployment/{DEPLOYMENT}")
        demo.kubectl("-n", NAMESPACE, "rollout", "status", f"deployment/{DEPLOYMENT}", "--timeout=180s", timeout=200)
        phases["rollout restart"] = str(stream.tally)
        with helm.Chart.load(CHART) as chart:   # a short certificate lifetime: renewed within a minute
            demo.helm().upgrade(chart, RELEASE, {**VALUES, "webhook": {"certLifetime": "45s"}},
                                namespace=NAMESPACE, wait="watcher", timeout=300)
        phases["helm upgrade"] = str(stream.tally)
        # The certificate in place keeps its year: deleted, the operator makes one of 45 s at once
        # (once the replaced Pods, which serve on a few seconds while stopping, are gone).
        eventually(lambda: len(demo.operator_pods()) == 2, timeout=60, what="only the upgraded replicas left")
        first = demo.kubectl(*secret).stdout
        demo.kubectl("-n", NAMESPACE, "delete", "secret", f"{RELEASE}-admission-policy-operator-tls")
        short = eventually(lambda: (demo.kubectl(*secret, check=False).stdout or first) != first and
                           demo.kubectl(*secret).stdout, timeout=60, interval=1, what="a new certificate")
        phases["certificate recreated"] = str(stream.tally)
        eventually(lambda: demo.kubectl(*secret).stdout != short, timeout=90, interval=2,
                   what="the serving certificate renewed")
        time.sleep(10)   # past the switch: both replicas serving the new certificate
        phases["certificate renewal"] = str(stream.tally)
        with helm.Chart.load(CHART) as chart:
            demo.helm().upgrade(chart, RELEASE, dict(VALUES), namespace=NAMESPACE, wait="watcher", timeout=300)
        phases["helm upgrade back"] = str(stream.tally)
    print("\n" + "\n".join(f"{phase}: {tally}" for phase, tally in phases.items()))
    assert stream.tally.right > 500 and stream.tally.wrong == [], phases


# How many rollout restarts and helm upgrades in a row the stream goes through below. CI runs a few;
# the long form (docs/operations.md, "Rollouts") is AP_NODE_ROLLOUT_CYCLES=10.
CYCLES = int(os.environ.get("AP_NODE_ROLLOUT_CYCLES", "3"))


def test_consecutive_rollout_restarts_and_helm_upgrades_fail_no_admission(demo: Node, policies: list[str]) -> None:
    """Issue 33: a replica stopping used to cut the API server's keep-alive connections to it, and
    a review written onto one as it closed failed (EOF; the API server does not retry a POST).
    Each cycle replaces both replicas twice, by `kubectl rollout restart` and by a `helm upgrade`
    that changes the Pod template, under two clients' steady stream of admissions: every answer
    must be the policy's."""
    apply_policies(demo, policies, stream_policy(DEMO))
    phases: list[str] = []
    with Admissions(demo.kubeconfig, DEMO) as stream, helm.Chart.load(CHART) as chart:
        time.sleep(2)
        for cycle in range(1, CYCLES + 1):
            demo.kubectl("-n", NAMESPACE, "rollout", "restart", f"deployment/{DEPLOYMENT}")
            demo.kubectl("-n", NAMESPACE, "rollout", "status", f"deployment/{DEPLOYMENT}", "--timeout=180s",
                         timeout=200)
            phases.append(f"rollout restart {cycle}: {stream.tally}")
            values = {**VALUES, "podAnnotations": {"e2e.policy-operator.dev/cycle": str(cycle)}}
            demo.helm().upgrade(chart, RELEASE, values if cycle < CYCLES else dict(VALUES), namespace=NAMESPACE,
                                wait="watcher", timeout=300)
            phases.append(f"helm upgrade {cycle}: {stream.tally}")
        # The last replaced replicas are done draining once only the two new ones are left.
        eventually(lambda: len(demo.operator_pods()) == 2, timeout=60, what="only the upgraded replicas left")
        time.sleep(2)
    print("\n" + "\n".join(phases))
    assert stream.tally.right > 100 * CYCLES and stream.tally.wrong == [], phases


# --- a plugin image, by the guide's recipe ------------------------------------------------------------

def test_a_plugin_image_built_by_the_guides_recipe_has_its_plugin_and_no_pip(installed: Node) -> None:
    """docs/writing-a-plugin.md: the package installed into a copy of the operator's venv in a
    stage of its own, only the venv taken back."""
    tag = "localhost/apo-acme:node-tier"
    build_image(REPO / "tests" / "plugin_package", tag,
                "--base", f"admission-policy-operator:latest={IMAGE_REPOSITORY}:{IMAGE_TAG}")
    listed = run_to_completion(installed, "plugin-list", tag, "admission-policy", "plugins")
    assert listed[0] == "Succeeded" and "label-checksum      validator" in listed[1]
    no_pip = run_to_completion(installed, "plugin-pip", tag, "python", "-c", "import pip")
    assert no_pip[0] == "Failed" and "No module named 'pip'" in no_pip[1]


def run_to_completion(cluster: Node, name: str, image: str, *command: str) -> tuple[str, str]:
    """(phase, logs) of a Pod running ``command`` once in ``image``."""
    cluster.kubectl("-n", "default", "run", name, "--restart=Never", f"--image={image}", "--image-pull-policy=Never",
                    "--command", "--", *command)
    try:
        phase: str = eventually(lambda: cluster.json("-n", "default", "get", "pod", name)["status"].get("phase")
                                in ("Succeeded", "Failed") and cluster.json("-n", "default", "get", "pod",
                                                                              name)["status"]["phase"],
                                timeout=90, what=f"pod {name} done")
        return phase, cluster.kubectl("-n", "default", "logs", name).stdout
    finally:
        cluster.kubectl("-n", "default", "delete", "pod", name, "--wait=false")


# --- helm uninstall: last ----------------------------------------------------------------------

def test_helm_uninstall_leaves_nothing_behind(installed: Node) -> None:
    installed.helm().uninstall("apo", wait="watcher", timeout=180)
    assert installed.kubectl("get", "validatingwebhookconfiguration,mutatingwebhookconfiguration",
                             "-o", "name").stdout.strip() == ""
    eventually(lambda: installed.operator_pods() == [], timeout=60, what="no operator Pod left")
    installed.apply({**sleeper("after-uninstall"), "metadata": {"name": "after-uninstall", "namespace": "default"}})
    installed.kubectl("delete", "pod", "after-uninstall", "-n", "default", "--wait=false")

